"""What a careless user or a hostile file gives the command line (issue 56 items 3 and 5):
names longer than the file system allows are a usage error, exit 2 and no store left
behind; names holding ESC, CR, BEL, NUL, a newline or a bidi override are written as
visible escapes wherever the terminal shows them, while CSV and JSON keep them exact."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from diffract import Session
from diffract.cli import main
from diffract.errors import ModelSourceError, printable

safetensors_numpy = pytest.importorskip("safetensors.numpy")

LONG = "x" * 300  # over NAME_MAX (255) of every common file system
HOSTILE = {"clear\x1b[2J.weight": "clear\\x1b[2J.weight",
           "over\rwrite.weight": "over\\rwrite.weight",
           "bell\x07.weight": "bell\\x07.weight",
           "nul\x00.weight": "nul\\x00.weight",
           "split\nrow.weight": "split\\nrow.weight",
           "bidi\u202etxt.weight": "bidi\\u202etxt.weight",
           "markup[bold]x[/bold].weight": "markup[bold]x[/bold].weight"}
#: What a terminal acts on: C0 and C1 controls but the newline, DEL, bidi controls.
DRIVES = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


class TestNamesTooLong:
    @pytest.mark.parametrize("argv", [["analyze", LONG], ["compare", LONG, LONG + "y"],
                                      ["track", LONG, "--store", "s"],
                                      ["analyze", "org/" + "x" * 5000]])
    def test_the_commands_say_so_with_exit_2(self, argv, tmp_path, monkeypatch, capsys):
        monkeypatch.chdir(tmp_path)
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "error:" in err and "Traceback" not in err and "Errno" not in err
        assert not (tmp_path / "s").exists()  # no store made for nothing

    def test_the_python_api_refuses_it_as_a_model_source(self):
        with Session() as s:
            for name in (LONG, "org/" + "x" * 5000):
                with pytest.raises(ModelSourceError, match="the file does not exist"):
                    s.models.add(name, "m")


class TestNamesThatDriveTheTerminal:
    @pytest.fixture
    def checkpoint(self, tmp_path):
        rng = np.random.default_rng(0)
        path = tmp_path / "m.safetensors"
        safetensors_numpy.save_file({name: rng.standard_normal((12, 8)).astype(np.float32)
                                     for name in HOSTILE}, str(path))
        return path

    def test_the_table_shows_every_name_escaped(self, checkpoint, capsys):
        assert main(["analyze", str(checkpoint), "--metrics", "stable_rank", "--executor",
                     "sequential"]) == 0
        out = capsys.readouterr().out
        assert not DRIVES.search(out), repr(DRIVES.search(out))
        for shown in HOSTILE.values():
            assert re.search(rf"^{re.escape(shown)}\s+12x8\s", out, re.M), shown

    def test_csv_and_json_keep_the_exact_names(self, checkpoint, capsys, tmp_path):
        assert main(["analyze", str(checkpoint), "--metrics", "stable_rank", "--format",
                     "json", "--executor", "sequential"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert {row["param"] for row in rows} == set(HOSTILE)
        assert main(["analyze", str(checkpoint), "--metrics", "stable_rank", "--format",
                     "csv", "--out", str(tmp_path / "out"), "--executor", "sequential"]) == 0
        import pandas as pd

        frame = pd.read_csv(tmp_path / "out" / "metrics.csv", keep_default_na=False)
        assert set(frame["param"]) == set(HOSTILE)

    def test_an_error_naming_a_model_id_escapes_it(self, tmp_path, capsys, monkeypatch):
        monkeypatch.chdir(tmp_path)
        assert main(["analyze", "bad\x1b[2J\nname"]) == 2
        err = capsys.readouterr().err
        assert not DRIVES.search(err) and "bad\\x1b[2J" in err
        assert err.count("\n") == 1  # the name's newline does not start a line of its own


def test_printable_escapes_what_drives_a_terminal_and_keeps_the_rest():
    text = "a\x1b[2Jb\rc\x07d\x00e\u202ef\u2066g\x85h é 日本\n"
    assert printable(text) == "a\\x1b[2Jb\\rc\\x07d\\x00e\\u202ef\\u2066g\\x85h é 日本\\n"
    assert printable(text, keep="\n").endswith("日本\n")


@pytest.mark.parametrize("kind", ["objects", "lists", "both"])
def test_the_json_depth_limit_is_exact_and_lists_count(tmp_path, kind):
    """A side file nested exactly MAX_JSON_DEPTH deep is read; one level more is refused,
    naming the file, whether the levels are objects, lists or both."""
    from diffract.core.sources import MAX_JSON_DEPTH, read_json_file

    def nested(levels: int) -> str:
        opens = [('{"a":' if kind == "objects" or (kind == "both" and i % 2) else "[")
                 for i in range(levels)]
        return "".join(opens) + "1" + "".join("}" if o.startswith("{") else "]"
                                              for o in reversed(opens))

    (tmp_path / "ok.json").write_text(nested(MAX_JSON_DEPTH))
    (tmp_path / "deep.json").write_text(nested(MAX_JSON_DEPTH + 1))
    assert read_json_file(tmp_path / "ok.json") == json.loads(nested(MAX_JSON_DEPTH))
    with pytest.raises(ModelSourceError, match=rf"deep.json' nests values deeper than "
                                               rf"{MAX_JSON_DEPTH} levels"):
        read_json_file(tmp_path / "deep.json")

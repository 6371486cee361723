"""A value a command shows as nan comes with its reason: `diffract analyze` and `diffract
compare` tell, after their tables, why each undefined value is undefined (grouped, the
chain of undefined inputs cut to its root cause), where they printed a bare "nan"."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("diffract_kernels_spectral")
pytest.importorskip("diffract_kernels_alignment")

from diffract.cli import main  # noqa: E402


def _block(out: str) -> list[str]:
    lines = out.splitlines()
    if "nan where a value is undefined:" not in lines:
        return []
    start = lines.index("nan where a value is undefined:") + 1
    block = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        block.append(line.strip())
    return block


def test_analyze_says_why_a_value_is_nan(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "m.npz", zero=np.zeros((64, 64)), w=rng.standard_normal((64, 80)))
    assert main(["analyze", str(tmp_path / "m.npz"), "--metrics",
                 "stable_rank,pl_alpha_hill,num_spikes,log_norm"]) == 0
    out = capsys.readouterr().out
    zero = next(line.split() for line in out.splitlines() if line.startswith("zero"))
    assert zero[2:] == ["nan"] * 4
    block = _block(out)
    assert "stable_rank on m/zero: stable_rank is undefined for an all-zero matrix " \
           "(every eigenvalue is 0)" in block
    assert any(line.startswith("pl_alpha_hill on m/zero: Hill's estimator needs")
               for line in block), block
    assert any(line.startswith("num_spikes on m/zero: marchenko_pastur is undefined")
               for line in block), block
    assert len(block) == 4 and not any("m/w" in line for line in block)


def test_analyze_leaves_alphas_reason_to_the_summary_and_cuts_input_chains(tmp_path,
                                                                              capsys):
    np.savez(tmp_path / "m.npz", zero=np.zeros((64, 64)),
             w=np.random.default_rng(0).standard_t(3, (300, 200)))
    assert main(["analyze", str(tmp_path / "m.npz"), "--metrics",
                 "pl_alpha,alpha_weighted"]) == 0
    out = capsys.readouterr().out
    assert "no alpha for 1 layer(s):" in out  # the summary tells pl_alpha's reason
    block = _block(out)
    assert len(block) == 1 and block[0].startswith("alpha_weighted on m/zero: only 0 positive")
    assert "is undefined: " not in block[0]  # "input 'pl_alpha' is undefined: ..." cut


def test_the_analyze_report_says_why_too(tmp_path, capsys):
    np.savez(tmp_path / "m.npz", zero=np.zeros((64, 64)),
             w=np.random.default_rng(0).standard_normal((64, 80)))
    assert main(["analyze", str(tmp_path / "m.npz"), "--metrics", "stable_rank",
                 "--report", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "<h2 id='undefined'>Undefined values</h2>" in page
    assert "<li>stable_rank on m/zero: stable_rank is undefined for an all-zero matrix " \
           "(every eigenvalue is 0)</li>" in page


def test_a_fully_defined_table_has_no_reasons(tmp_path, capsys):
    np.savez(tmp_path / "m.npz", w=np.random.default_rng(0).standard_normal((64, 80)))
    assert main(["analyze", str(tmp_path / "m.npz"), "--metrics", "stable_rank"]) == 0
    assert "nan where" not in capsys.readouterr().out


def test_compare_says_why_a_pair_is_nan(tmp_path, capsys):
    """Under svd top_k = 8 the fields over every direction (and the top tenth, 20 of 200)
    are undefined: each says what to set, on every pair it left undefined."""
    rng = np.random.default_rng(0)
    a = {f"l{i}": rng.standard_normal((200, 300)) for i in range(2)}
    np.savez(tmp_path / "a.npz", **a)
    np.savez(tmp_path / "b.npz", **{k: v + 0.1 * rng.standard_normal(v.shape)
                                    for k, v in a.items()})
    assert main(["compare", str(tmp_path / "a.npz"), str(tmp_path / "b.npz"), "--set",
                 "svd.top_k=8", "--report", str(tmp_path / "r.html")]) == 0
    block = _block(capsys.readouterr().out)
    page = (tmp_path / "r.html").read_text()
    assert "<h2 id='undefined'>Undefined values</h2>" in page
    assert page.count("(svd.top_k=8): set ") == 3
    assert len(block) == 3, block
    want = {"avg_max_l_agreement": "set l_overlap.k=8 or less, or svd.top_k=0",
            "l_subspace_overlap": "set l_subspace.k=8 or less, or svd.top_k=20 or more",
            "sval_rel_change": "set sval_rel_change.k=8 or less, or svd.top_k=0"}
    for field, fix in want.items():
        (line,) = [x for x in block if x.startswith(f"{field} on [a,b]/l0 and 1 more: ")]
        assert fix in line and "(svd.top_k=8)" in line


def test_compare_says_which_parameters_it_could_not_compare(tmp_path, capsys):
    """A parameter shaped differently in the second checkpoint is skipped: it has no row
    in the tables (it was left out without a word), and a line says why."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "a.npz", l0=rng.standard_normal((20, 30)), l1=rng.standard_normal((20, 30)))
    np.savez(tmp_path / "b.npz", l0=rng.standard_normal((20, 31)), l1=rng.standard_normal((20, 30)))
    assert main(["compare", str(tmp_path / "a.npz"), str(tmp_path / "b.npz"), "--metrics",
                 "sval_rel_change,weights_rel_change"]) == 0
    out = capsys.readouterr().out
    assert not [line for line in out.splitlines() if line.startswith("l0 ")]
    lines = out.splitlines()
    start = lines.index("not computed, so not in the tables:")
    assert lines[start + 1].strip() == (
        "sval_rel_change, weights_rel_change on [a,b]/l0: parameter 'l0' has shape (20, 30) "
        "in 'a' but (20, 31) in 'b'")

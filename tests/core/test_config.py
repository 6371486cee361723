"""Configuration from TOML files and mappings: defaults, validation."""

from __future__ import annotations

import pytest

from diffract.config import Config, load_config
from diffract.errors import ConfigError


class TestConfig:
    def test_defaults_without_file(self, monkeypatch):
        """No config and no DIFFRACT_CONFIG gives the documented defaults."""
        monkeypatch.delenv("DIFFRACT_CONFIG", raising=False)
        config = load_config(None)
        assert config == Config()
        assert 1 <= config.thread_workers <= 8 and config.executor == "processes"
        assert config.cache_headroom == 0.25 and config.cache_max_bytes == 0

    def test_reads_the_guides_toml(self, tmp_path, monkeypatch):
        """[parallel.thread_pool] and [parallel.process_pool] max_workers come from TOML."""
        path = tmp_path / "diffract.toml"
        path.write_text(
            "[parallel.thread_pool]\nmax_workers = 3\n\n[parallel.process_pool]\nmax_workers = 5\n\n"
            "[cache]\nmax_bytes = 1000000\nheadroom = 0.5\n"
        )
        config = load_config(path)
        assert (config.thread_workers, config.process_workers) == (3, 5)
        assert (config.cache_max_bytes, config.cache_headroom) == (1_000_000, 0.5)
        monkeypatch.setenv("DIFFRACT_CONFIG", str(path))
        assert load_config(None) == config

    def test_every_problem_is_listed(self):
        """Unknown keys (with suggestions) and wrong types are all reported at once."""
        with pytest.raises(ConfigError) as info:
            load_config({"paralel": {}, "cache": {"headroom": "lots", "max_byte": 3}})
        text = str(info.value)
        assert "unknown key 'paralel'. Did you mean 'parallel'?" in text
        assert "unknown key 'cache.max_byte'. Did you mean 'max_bytes'?" in text
        assert "'cache.headroom' must be a number, got 'lots'" in text

    def test_bad_values_and_files(self, tmp_path):
        """Out-of-range values, missing files and bad TOML get clear errors."""
        with pytest.raises(ConfigError, match="max_workers must be at least 1, got 0"):
            load_config({"parallel": {"thread_pool": {"max_workers": 0}}})
        with pytest.raises(ConfigError, match="does not exist"):
            load_config(tmp_path / "missing.toml")
        bad = tmp_path / "bad.toml"
        bad.write_text("[parallel\n")
        with pytest.raises(ConfigError, match="is not valid TOML"):
            load_config(bad)

    def test_unknown_executor_is_reported_when_the_session_opens(self):
        """An executor name no plugin provides fails at Session(), with the available names."""
        from diffract import Session
        from diffract.errors import UnknownExecutorError

        with pytest.raises(UnknownExecutorError, match=r"Unknown executor 'dusk'.*Available executors: .*'processes', (.*, )?'sequential', 'threads'"):
            Session(config={"parallel": {"executor": "dusk"}})

from pathlib import Path

import pytest

from robofleet.settings import SettingsError, load_settings


def test_defaults_are_embedded_and_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s = load_settings()
    assert s.data_dir == Path("robofleet-data")
    assert s.database_url == "sqlite:///robofleet-data/robofleet.db"
    assert s.comms.bind_host == "127.0.0.1"
    assert s.dashboard.bind_host == "127.0.0.1"


def test_yaml_then_env_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "rf.yaml"
    cfg.write_text("data_dir: /srv/rf\ncomms:\n  grpc_port: 6000\ndashboard:\n  port: 9000\n")
    monkeypatch.setenv("ROBOFLEET_DASHBOARD__PORT", "9100")
    s = load_settings(cfg)
    assert s.data_dir == Path("/srv/rf")
    assert s.database_url == "sqlite:////srv/rf/robofleet.db"
    assert s.comms.grpc_port == 6000
    assert s.dashboard.port == 9100  # environment beats the file


def test_config_env_var_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "other.yaml"
    cfg.write_text("log_level: DEBUG\n")
    monkeypatch.setenv("ROBOFLEET_CONFIG", str(cfg))
    assert load_settings().log_level == "DEBUG"


def test_bad_value_names_key_and_allowed(tmp_path: Path) -> None:
    cfg = tmp_path / "rf.yaml"
    cfg.write_text("comms:\n  grpc_port: 70000\nlog_level: LOUD\n")
    with pytest.raises(SettingsError) as err:
        load_settings(cfg)
    msg = str(err.value)
    assert "comms.grpc_port" in msg and "65535" in msg
    assert "log_level" in msg and "'ERROR'" in msg


def test_unknown_key_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "rf.yaml"
    cfg.write_text("bufer:\n  memory_budget_bytes: 10\n")
    with pytest.raises(SettingsError, match="bufer: unknown setting"):
        load_settings(cfg)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="not found"):
        load_settings(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(SettingsError, match=r"bad\.yaml line 2, column 1: expected the node"):
        load_settings(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(SettingsError, match="mapping"):
        load_settings(scalar)


def test_secret_is_masked_and_generated_once(tmp_path: Path) -> None:
    s = load_settings(
        data_dir=tmp_path,
        secret_key="hunter2",
        database_url="postgresql+psycopg://u:pw@127.0.0.1/db",
    )
    shown = s.masked()
    assert shown["secret_key"] == "***"
    assert "pw" not in shown["database_url"] and "***" in shown["database_url"]
    g = load_settings(data_dir=tmp_path / "d")
    first = g.secret()
    assert len(first) > 40 and g.secret() == first
    assert (tmp_path / "d" / "secret_key").stat().st_mode & 0o777 == 0o600


def test_auto_resume_comes_from_settings_and_the_flag_can_only_turn_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from robofleet.commands.cloud import auto_resume, build_parser

    flag_off = build_parser().parse_args(["--no-auto-resume"])
    no_flag = build_parser().parse_args([])
    on = load_settings(None, data_dir=tmp_path)
    assert auto_resume(on, no_flag) and not auto_resume(on, flag_off)
    monkeypatch.setenv("ROBOFLEET_ORCHESTRATION__AUTO_RESUME", "false")
    off = load_settings(None, data_dir=tmp_path)
    assert not auto_resume(off, no_flag)


def test_a_yaml_syntax_error_is_one_line_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("buffer:\n  memory_budget_bytes: 10\nhal: x: y\n")
    with pytest.raises(SettingsError) as err:
        load_settings(bad)
    assert str(err.value) == f"{bad} line 3, column 7: mapping values are not allowed here"

import pytest
import wandb

from minigpt.common import UsageError
from minigpt.training import loggers
from minigpt.training.loggers import wandb_mode


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(loggers, "wandb_reachable", lambda timeout=3.0: True)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))


def test_auto_is_offline_without_credentials(no_credentials: None) -> None:
    assert wandb_mode("auto") == "offline"


def test_auto_is_online_with_an_api_key(no_credentials: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("auto") == "online"


def test_auto_is_online_with_a_netrc_entry(no_credentials: None, tmp_path) -> None:
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    (tmp_path / "netrc").chmod(0o600)
    assert wandb_mode("auto") == "online"


def test_wandb_mode_env_overrides_auto(no_credentials: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode("auto") == "disabled"


def test_online_without_credentials_is_an_error_not_a_prompt(no_credentials: None) -> None:
    with pytest.raises(UsageError, match="wandb login"):
        wandb_mode("online")


def test_an_empty_wandb_mode_env_means_auto(no_credentials: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "")
    assert wandb_mode("auto") == "offline"


def test_a_bad_wandb_mode_env_is_a_usage_error(no_credentials: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(UsageError, match="WANDB_MODE"):
        wandb_mode("auto")


def test_auto_falls_back_to_offline_when_the_server_is_unreachable(
    no_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setattr(loggers, "wandb_reachable", lambda timeout=3.0: False)
    assert wandb_mode("auto") == "offline"


def test_reachability_check_fails_fast_for_a_closed_port(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import time

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]  # bound but not listening: connections are refused
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
        start = time.perf_counter()
        assert loggers.wandb_reachable(timeout=3.0) is False
        assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("given", [{}, {"init": {"settings": None}}], ids=["no settings", "settings null"])
def test_a_disabled_run_starts_without_wandb_warning_about_git(
    given: dict, monkeypatch: pytest.MonkeyPatch, tmp_path, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    logger = loggers.AutoWandbLogger(save_dir=tmp_path / "new-run", **given)  # a run folder not made yet
    try:
        logger.experiment  # noqa: B018 (starts the run)
    finally:
        wandb.finish()  # or the next test's logger would take over this run instead of starting one
    assert "git root" not in capfd.readouterr().err

import sys

import pytest
import wandb

from minigpt.common import UsageError
from minigpt.training import loggers, wandb_process
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


def test_a_starting_run_looks_for_launch_inputs_only_once_their_module_is_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from wandb.sdk import wandb_run
    from wandb.sdk.launch.inputs import internal

    applied = []
    monkeypatch.setattr(internal.StagedLaunchInputs, "apply", lambda self, run: applied.append(run))
    step = wandb_run.Run._detect_and_apply_job_inputs
    monkeypatch.setattr(wandb_run.Run, "_detect_and_apply_job_inputs", step)  # put back after the test
    wandb_process.launch_inputs_only_where_staged()
    wandb_process.launch_inputs_only_where_staged()  # once per process: a second call changes nothing
    run = object()
    wandb_run.Run._detect_and_apply_job_inputs(run)  # the module is imported: wandb's own step runs
    assert applied == [run]
    monkeypatch.delitem(sys.modules, wandb_process.LAUNCH_INPUTS)
    wandb_run.Run._detect_and_apply_job_inputs(run)  # nothing can have staged inputs: skipped
    assert applied == [run] and wandb_process.LAUNCH_INPUTS not in sys.modules  # and not imported


def test_wandb_stages_launch_inputs_in_that_module_alone() -> None:
    """What the skip relies on: the run's step reads the inputs from LAUNCH_INPUTS, and no other
    part of wandb makes the object that holds them."""
    import inspect
    from pathlib import Path

    from wandb.sdk import wandb_run

    step = wandb_run.Run._detect_and_apply_job_inputs
    step = getattr(step, "wandb_step", step)  # wandb's own, where the skip is installed
    assert f"from {wandb_process.LAUNCH_INPUTS} import StagedLaunchInputs" in inspect.getsource(step)
    package = Path(wandb.__file__).parent
    makers = [
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if "StagedLaunchInputs(" in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert sorted(makers) == ["sdk/launch/inputs/internal.py", "sdk/wandb_run.py"]

"""`rollups dev` (what `make dev` runs) and `rollups spark-server`: the local development
deployment, a Dagster UI and daemon with a warm Spark server beside them."""

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import click

from rollup_assets.cli.app import FORMATS, catalog, echo_data, handle_errors, main, settings
from rollup_assets.model.errors import WarmSparkError


def _server() -> ModuleType:
    """The server module, imported on use (it imports pyspark)."""
    from rollup_assets.resources import spark_server

    return spark_server


@main.group(name="spark-server")
def spark_server_group() -> None:
    """The warm Spark server: a long-lived local Spark Connect server that runs attach to
    instead of each starting a JVM (`rollups dev` starts and stops it). Runs use it when it is
    up and was started with the code on disk now; otherwise they start local Spark. State:
    ROLLUPS_SPARK_SERVER_DIR (default $DAGSTER_HOME/spark-connect); port:
    ROLLUPS_SPARK_SERVER_PORT (default 15002). Not used when ROLLUPS_SPARK_MASTER or
    ROLLUPS_SPARK_REMOTE is set."""


def _start(restart: bool) -> dict:
    s = settings()
    server = _server()
    try:
        if restart:
            server.stop(s.warm_spark_dir)
        state = server.start(
            s.warm_spark_dir,
            environ=os.environ,
            port=s.spark_server_port,
            delta_jars=s.delta_jars,
            python=s.pyspark_python,
        )
    except server.SparkServerError as exc:
        raise WarmSparkError(str(exc)) from None
    return {"url": state.url, "pid": state.pid, "state": str(s.warm_spark_dir)}


@spark_server_group.command(name="start")
@click.option("--format", "fmt", type=FORMATS, default="table")
@handle_errors
def start_server(fmt: str) -> None:
    """Start the warm Spark server and wait until it accepts connections."""
    echo_data(_start(restart=False), fmt)


@spark_server_group.command(name="restart")
@click.option("--format", "fmt", type=FORMATS, default="table")
@handle_errors
def restart_server(fmt: str) -> None:
    """Stop the warm Spark server if one runs, and start it again (after a code change)."""
    echo_data(_start(restart=True), fmt)


@spark_server_group.command(name="stop")
@handle_errors
def stop_server() -> None:
    """Stop the warm Spark server (the JVM and its Python workers)."""
    state = _server().stop(settings().warm_spark_dir)
    click.echo(f"stopped the server at {state.url}" if state else "no warm Spark server recorded")


@spark_server_group.command(name="status")
@click.option("--format", "fmt", type=FORMATS, default="table")
@handle_errors
def server_status(fmt: str) -> None:
    """Whether runs would use the warm Spark server, and why not; exits 1 when they would not."""
    found = _server().status(settings().warm_spark_dir)
    echo_data(
        {
            "usable": found.usable,
            "url": found.state.url if found.state else None,
            "pid": found.state.pid if found.state else None,
            "reason": found.reason,
        },
        fmt,
    )
    if not found.usable:
        sys.exit(1)


@main.command(
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": ["--help"],  # -h is `dagster dev`'s --host
    }
)
@click.option("--no-warm-spark", is_flag=True, help="Do not start the warm Spark server.")
@click.argument("dagster_args", nargs=-1, type=click.UNPROCESSED)
@handle_errors
def dev(no_warm_spark: bool, dagster_args: tuple[str, ...]) -> None:
    """The Dagster UI and daemon (`dagster dev`, extra arguments passed on) with a warm Spark
    server beside them, restarted so it runs the code on disk; Ctrl-C stops both."""
    from rollup_assets.orchestration.instance import (
        ensure_pools,
        get_instance,
        use_range_event_settings,
    )

    s = settings()
    instance = get_instance(s)
    ensure_pools(instance, catalog())
    instance.dispose()
    warm = s.uses_warm_spark and not no_warm_spark
    if warm:
        click.echo("starting the warm Spark server ...", err=True)
        info = _start(restart=True)
        click.echo(f"warm Spark server at {info['url']} (pid {info['pid']})", err=True)
    args = list(dagster_args)
    if not any(a in ("-w", "--workspace", "-m", "--module-name", "-f") for a in args):
        workspace = Path("workspace.yaml")
        args = ["-w", str(workspace)] if workspace.exists() else ["-m", "rollup_assets.definitions"]
        args += list(dagster_args)
    dagster = Path(sys.executable).with_name("dagster")
    # `dagster dev` finds its home in its environment, and its daemon and webserver create the
    # runs the sensors and the UI request.
    env = {**os.environ, "DAGSTER_HOME": str(s.dagster_home)}
    use_range_event_settings(env)
    # Its own session: a Ctrl-C reaches this process only, which passes it on exactly once
    # (two interrupts would make `dagster dev` skip its orderly shutdown).
    child = subprocess.Popen([str(dagster), "dev", *args], env=env, start_new_session=True)

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if child.poll() is None:
            child.terminate()
            child.wait(30)
        if warm:
            state = _server().stop(s.warm_spark_dir)
            if state is not None:
                click.echo(f"stopped the warm Spark server at {state.url}", err=True)
    sys.exit(code)

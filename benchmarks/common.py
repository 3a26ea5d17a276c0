"""Shared bits of the benchmark scripts: result files; what machine a result came from, its table and
write_json are experiments' (re-exported here)."""

from pathlib import Path

from experiments.results.atomic import atomic_write_text
from experiments.results.environment import cpu_name, environment, git_commit, load_average, markdown_table
from experiments.results.files import write_json

__all__ = ["FULL_AZURE", "cpu_name", "environment", "git_commit", "load_average", "markdown_table", "publish"]
__all__ += ["write_json"]


def publish(out: Path, stem: str, md: str, env: dict, data: dict) -> None:
    """A benchmark's result pair, out/stem.{json,md}, each written whole: the markdown ends with the command and
    the machine's load before and after (env["load_before"], env["load_after"]), the JSON holds env + data."""
    md += f"- command: `{env['command']}`\n- load average before: {env['load_before']}; after: {env['load_after']}\n"
    write_json(out / f"{stem}.json", {"env": env, **data})
    atomic_write_text(out / f"{stem}.md", md)
    print(md)


# the full Azure conversation trace beside the checkout (or beside its worktree folder); only if present
_ROOT = Path(__file__).resolve().parents[1]
FULL_AZURE = (
    next(
        (p for p in (_ROOT.parent / "shared", _ROOT.parent.parent / "shared") if (p / "traces").is_dir()),
        _ROOT.parent / "shared",
    )
    / "traces"
    / "azure_llm_2023_conv.csv"
)

"""The documents' examples run: every fenced block of README.md and docs/*.md.

- ```python blocks are executed on the CPU (Warp's default device where there is no GPU).
  The blocks of one page run in order in ONE namespace per page, so a later block may use
  what an earlier one made (as a reader running the page top to bottom would); each
  page runs in a temporary folder that holds a link to the checkout's ``scenes/``.
- ```bash blocks are marked ``<!-- run -->`` (every command line of the block runs, with
  ``arc-warp`` / ``python`` as this interpreter, and must exit 0) or ``<!-- skip: REASON -->``.
- ```text blocks are output, never run. A fence with another language, or none, fails
  (an example nobody runs is what rots first).

Markers, an HTML comment on the line right before a block's fence:

- ``<!-- skip: REASON -->``: not run here (a dataset, another project's checkout, a
  browser); reported as skipped with REASON. Later blocks of the page must not need it.
- ``<!-- gpu: REASON -->``: needs CUDA; runs where Warp and torch see a GPU (marked
  ``gpu``), skipped elsewhere with REASON.
- ``<!-- run -->``: a bash block that runs (cheap commands only).

Relative links of the pages must point at files of the checkout.
"""

import dataclasses
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import warp as wp
from conftest import needs_cpu_kernels

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = ("python", "bash", "text")
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*(skip|gpu|run)\s*(?::\s*(.*?))?\s*-->\s*$")
LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclasses.dataclass(frozen=True)
class Block:
    page: pathlib.Path
    line: int  # 1-based line of the first code line
    language: str
    code: str
    marker: str | None  # "skip", "gpu", "run" or None
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: pathlib.Path) -> list[Block]:
    """The fenced blocks of a markdown page, with the marker on the line before each."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a code fence that is never closed")
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        found.append(Block(page, i + 2, m.group(1), "\n".join(lines[i + 1:end]) + "\n",
                           marker.group(1) if marker else None, (marker.group(2) or "") if marker else ""))
        i = end + 1
    return found


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def cuda_available() -> bool:
    wp.config.log_level = wp.LOG_WARNING
    return wp.is_cuda_available()


def _param(block: Block):
    marks = []
    if block.marker == "skip":
        marks.append(pytest.mark.skip(reason=f"{block.id}: {block.reason or 'marked skip'}"))
    elif block.marker == "gpu":
        marks += [pytest.mark.gpu,
                  pytest.mark.skipif("not cuda_available()", reason=f"{block.id}: needs CUDA: {block.reason}"),
                  needs_cpu_kernels]  # the page's earlier blocks run on Warp's CPU backend
    return pytest.param(block, id=block.id, marks=marks)


@dataclasses.dataclass
class PageRun:
    """One page's namespace and folder, and how far its blocks have run."""

    namespace: dict
    folder: pathlib.Path
    done: int = 0  # python blocks of the page run so far (in order)
    failed: str = ""


_runs: dict[pathlib.Path, PageRun] = {}


def _page_run(page: pathlib.Path, tmp_path_factory) -> PageRun:
    run = _runs.get(page)
    if run is None:
        folder = tmp_path_factory.mktemp(page.stem)
        (folder / "scenes").symlink_to(ROOT / "scenes", target_is_directory=True)
        run = _runs[page] = PageRun({"__name__": f"docs_{page.stem}"}, folder)
    return run


def _execute(block: Block, run: PageRun) -> None:
    # padded so that tracebacks (and Warp's kernel source lookup, which reads the page
    # through linecache) give the page's own line numbers
    code = compile("\n" * (block.line - 1) + block.code, str(block.page), "exec")
    cwd, cpu_blocks = os.getcwd(), wp.config.enable_cpu_blocks  # a page may change either
    os.chdir(run.folder)
    try:
        exec(code, run.namespace)
    finally:
        os.chdir(cwd)
        wp.config.enable_cpu_blocks = cpu_blocks


def _runnable(block: Block) -> bool:
    return block.language == "python" and (block.marker is None or (block.marker == "gpu" and cuda_available()))


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if b.language == "python"])
def test_python_block_runs(block, tmp_path_factory):
    """The page's earlier blocks run first (once per page), then this one."""
    run = _page_run(block.page, tmp_path_factory)
    if run.failed:
        pytest.fail(f"an earlier block of the page failed ({run.failed}), and this one may need it")
    earlier = [b for b in BLOCKS if b.page == block.page and _runnable(b)]
    index = earlier.index(block)
    for previous in earlier[run.done:index + 1]:
        try:
            _execute(previous, run)
        except BaseException:
            run.failed = previous.id
            raise
        run.done += 1


def _command(line: str) -> str:
    """A shell line with ``arc-warp`` and ``python`` run by this interpreter (the checkout
    under test, installed or not)."""
    words = shlex.split(line)
    if words[0] == "arc-warp":
        words = [sys.executable, "-m", "arc_warp.cli", *words[1:]]
    elif words[0] in ("python", "python3"):
        words = [sys.executable, *words[1:]]
    return shlex.join(words)


def _bash_param(block: Block):
    if block.marker == "run":
        return pytest.param(block, id=block.id)
    reason = block.reason if block.marker == "skip" else "no <!-- run --> marker"
    return pytest.param(block, id=block.id, marks=pytest.mark.skip(reason=f"{block.id}: {reason}"))


@pytest.mark.parametrize("block", [_bash_param(b) for b in BLOCKS if b.language == "bash"])
def test_bash_block_runs(block, tmp_path):
    (tmp_path / "scenes").symlink_to(ROOT / "scenes", target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), str(ROOT / "plugins"), str(ROOT / "apps"), os.environ.get("PYTHONPATH", "")]))
    for line in block.code.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        done = subprocess.run(_command(line), shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{block.id}: `{line}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


def test_every_block_has_a_known_language_and_marker():
    wrong = [f"{b.id}: ```{b.language or '(none)'}" for b in BLOCKS if b.language not in LANGUAGES]
    wrong += [f"{b.id}: <!-- run --> on a {b.language} block" for b in BLOCKS
              if b.marker == "run" and b.language != "bash"]
    wrong += [f"{b.id}: <!-- {b.marker} --> with no reason" for b in BLOCKS if b.marker in ("skip", "gpu")
              and not b.reason]
    wrong += [f"{b.id}: a bash block needs <!-- run --> or <!-- skip: REASON -->" for b in BLOCKS
              if b.language == "bash" and b.marker not in ("run", "skip")]
    assert not wrong, "blocks the documentation test cannot run or explain:\n" + "\n".join(wrong)


def test_relative_links_point_at_files():
    missing = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)

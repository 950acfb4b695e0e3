"""MPLang in a Jupyter notebook, executed by nbclient with a real kernel: a long run shows
one live progress display (updated in place), `mp.analyze` reports and audit summaries
render as HTML tables, and no native library log line reaches a cell."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

CELLS = [
    """
    import pyarrow as pa
    import mplang as mp
    from mplang import simp
    from mplang.dialects import table
    from mplang.libs import psi
    from mplang.policy.policy import Policy

    # policies that allow what these cells do (the join keeps fewer rows than the init
    # policies' min_rows) and, unlike policies="open", print no note into a cell
    allow = Policy.parse("plaintext_to: ['*']\\nwrites: ['*']\\n")
    sim = mp.Simulator(3, latency_ms=150, policies={f"node_{i}": allow for i in range(3)})


    def shared():
        a = simp.pcall((0,), lambda: table.constant(pa.table({"id": pa.array([1, 2, 3, 4])})))
        b = simp.pcall((1,), lambda: table.constant(pa.table({"id": pa.array([3, 4, 5])})))
        left, _ = psi.join(a, b, "id")
        return simp.pcall((0,), lambda t: table.to_tensor(t, ["id"]), left)


    ids = mp.fetch(sim, mp.evaluate(sim, shared, progress=False))[0]
    print("shared ids:", ids.ravel().tolist())
    """,
    """
    def ring():
        r = simp.prank()
        for _ in range(12):
            r = simp.shuffle_static(r, {0: 2, 1: 0, 2: 1})
        return r


    print("after a ring:", [int(v) for v in mp.fetch(sim, mp.evaluate(sim, ring))])
    """,
    """
    mp.analyze(mp.compile(ring, world_size=3))
    """,
    """
    from mplang.records.audit import AuditLog, summarize

    log = AuditLog("audit/node_0.jsonl", "node_0", ["node_0", "node_1"])
    log.execution("e1", "", "d" * 64, ("driver", "ab" * 32), "accepted", name="stats",
                  rule="the default policy")
    log.message("send", "e1", 1, "/1", "secret share", 40)
    log.end("e1", "")
    log.close()
    summarize(["audit/node_0.jsonl"])
    """,
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    folder = tmp_path_factory.mktemp("notebook")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in CELLS]
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(folder)}})
    with pytest.MonkeyPatch.context() as patch:
        # as under Jupyter: a kernel started from pytest would not forward what native
        # code writes to descriptors 1 and 2 to the cells (ipykernel's watchfd)
        patch.delenv("PYTEST_CURRENT_TEST", raising=False)
        for name in ("MPLANG_LOG", "MPLANG_LOG_FILE"):
            patch.delenv(name, raising=False)
        client.execute()
    nbformat.validate(nb)
    (folder / "executed.ipynb").write_text(nbformat.writes(nb))
    return [cell.outputs for cell in nb.cells]


def test_no_native_log_line_reaches_a_cell(executed: list[Any]) -> None:
    """The PSI join's libpsi, libspu and perfetto lines go to the log file."""
    assert [(o.output_type, o.get("name"), o.get("text")) for o in executed[0]] == [
        ("stream", "stdout", "shared ids: [3, 4]\n")]


def test_a_long_run_shows_one_live_progress_display(executed: list[Any]) -> None:
    outputs = executed[1]
    displays = [o for o in outputs if o.output_type == "display_data"]
    streams = [o for o in outputs if o.output_type == "stream"]
    assert len(displays) == 1, outputs  # updated in place, not one output per op
    html = displays[0].data["text/html"]
    assert html.startswith("<div><b>ring</b> <progress value='")
    total = html.split("max='")[1].split("'")[0]
    assert f"{total}/{total} ops" in html  # its last update: the run finished
    assert "<th>party</th><th>running</th><th>done</th><th>moved</th>" in html
    assert [(o.name, o.text) for o in streams] == [("stdout", "after a ring: [0, 1, 2]\n")]


def test_an_analysis_report_renders_as_tables(executed: list[Any]) -> None:
    [result] = executed[2]
    html = result.data["text/html"]
    assert html.startswith("<table><caption>analysis of @ring (3 parties)</caption>")
    assert "<th>operation</th>" in html and html.count("<table>") == 2
    assert result.data["text/plain"].startswith("AnalysisReport(")


def test_an_audit_summary_renders_as_tables(executed: list[Any]) -> None:
    [result] = executed[3]
    html = result.data["text/html"]
    assert html.startswith("<table><caption>audit of node_0</caption>")
    assert ("<td>1</td><td>stats</td><td>dddddddddddddddd...</td><td>driver</td><td>-</td>"
            "<td>node_0: accepted (the default policy); ended ok</td>"
            "<td>node_0 -&gt; node_1: secret share 40 bytes in 1 message</td>") in html

"""Reports of run directories: one package for Markdown, summary.json and plots; what is
hidden before anything is shared is nsadiag.redact (the run directory records it too).

    skeleton.py  the layout every report.md shares: top block, Summary, Results, sections
    top.py       the top block and the bullet lists of a finding
    markdown.py  the formatting every report shares (units, tables, evidence, reproduction)
    summary.py   summary.json as a typed model (nsadiag/schemas/summary.schema.json)
    ranks.py     the per-rank table: each rank by host, global, local and node rank
    plots.py     the PNG plots
    sweep.py, seq.py, ddp.py, check.py, triage.py, memory.py, trace.py, stacks.py, run.py,
    attach.py
                 one renderer per run kind: (markdown, summary.json) from stored records
    dispatch.py  render_run(run_dir): the kind from run.json, the renderer, redaction, files
    bundle.py    write_bundle(run_dir): a redacted archive for sharing

Renderers import nothing from each other; each imports the shared modules only. This
package imports no renderer on its own.
"""

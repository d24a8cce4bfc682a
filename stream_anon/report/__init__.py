"""Visual report of a run: ``stream-anon report RUN_DIR`` (``stream_anon.report.html.write_report``).

Run-directory format: ``stream_anon.report.rundir`` and docs/deploy.md.
"""

"""The report skeleton (nsadiag.report.skeleton): where the blank lines of a report.md go.

A finding's report opens with the top block, the Summary (a note after it, a blank line
between) and the Results; every section is a blank line, its heading and, when it has a
body, a blank line and the body; a section with no body is its heading alone; the text
ends in one newline. A trailing section's text follows a report's text as it stands."""

from nsadiag.finding import Finding, Item
from nsadiag.report.skeleton import Report, Section


def _finding() -> Finding:
    return Finding(command="check", verdict="ERROR", kind="crashed", status="failure",
                   headline="ERROR in forward", subject="tiny, 1 layer",
                   next_action="Fix the shape.", summary=["The forward raised."],
                   results=[Item("fail", "forward raised"), Item("ok", "backward ran")])


def test_a_findings_report_opens_with_the_top_block_summary_and_results():
    report = Report.of(_finding(), summary_note=["Machine: 2 cores."])
    lines = report.markdown().splitlines()
    assert lines[0] == "# nsadiag check: ❌ ERROR in forward"
    start = lines.index("## Summary")
    assert lines[start - 1:start + 8] == [
        "", "## Summary", "", "The forward raised.", "", "Machine: 2 cores.", "",
        "## Results", ""]
    assert lines[start + 8:] == ["- ❌ forward raised", "- ✅ backward ran"]


def test_given_results_replace_the_findings_items():
    text = Report.of(_finding(), results=["**a**", "", "- x"]).markdown()
    assert text.endswith("## Results\n\n**a**\n\n- x\n")


def test_sections_follow_in_order_with_one_blank_line_around_each_heading():
    report = Report(["# title"])
    body = report.add("Evidence", ["line 1"]).body
    body.append("line 2")
    report.add("Empty", [])
    report.add("Time", ["12 s"])
    assert report.markdown() == ("# title\n\n## Evidence\n\nline 1\nline 2\n\n## Empty\n\n"
                                 "## Time\n\n12 s\n")


def test_a_trailing_section_appends_to_a_rendered_report():
    text = Report(["# title"], [Section("Results", ["- ok"])]).markdown()
    text += Section("Records skipped", ["- line 3: torn"]).markdown()
    assert text == "# title\n\n## Results\n\n- ok\n\n## Records skipped\n\n- line 3: torn\n"

//! The report as one self-contained HTML page: inline CSS, inline SVG plots, no scripts and
//! nothing fetched, so it can be mailed, archived or opened from a file.

use std::fmt::Write;

use anyhow::Result;

use super::Report;
use super::sections::{Section, Table};

const STYLE: &str = "
body { font-family: 'DejaVu Sans', sans-serif; margin: 2em auto; max-width: 1180px;
       padding: 0 1em; color: #1b1f24; line-height: 1.45; }
h1 { margin-bottom: 0.2em; }
h2 { margin-top: 2.2em; border-bottom: 2px solid #cbd5e1; padding-bottom: 0.2em; }
p.paper { color: #475569; font-style: italic; margin-top: 0; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.92em; }
th, td { border: 1px solid #cbd5e1; padding: 0.25em 0.6em; text-align: left;
         vertical-align: top; }
th { background: #f1f5f9; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
caption { caption-side: top; text-align: left; font-weight: bold; padding-bottom: 0.3em; }
ul.notes li { margin-bottom: 0.3em; }
li.error { color: #b91c1c; }
figure.plot { border: 2px solid; margin: 1.2em 0; padding: 0.5em; display: table;
              max-width: 100%; box-sizing: border-box; }
figure.plot svg { max-width: 100%; height: auto; display: block; }
figcaption { display: table-caption; caption-side: bottom; color: #334155;
             font-size: 0.9em; padding: 0.4em 0.5em 0; }
code { background: #f1f5f9; padding: 0 0.2em; }
details { margin: 1em 0; }
";

/// The frame colour of the page's `index`th plot: slate shades a step apart, one per plot
/// and used nowhere else on the page, so a screenshot can be checked plot by plot (the
/// colour bounds the plot's box).
pub fn frame_colour(index: usize) -> (u8, u8, u8) {
    (200, 210, 222u8.saturating_sub(index.min(200) as u8))
}

/// Escapes text for HTML element content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Text with `code` spans (backticks) set as <code>.
fn prose(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 {
            let _ = write!(out, "<code>{}</code>", escape(part));
        } else {
            out.push_str(&escape(part));
        }
    }
    out
}

/// A cell that holds a number is right-aligned.
fn cell(text: &str) -> String {
    let numeric = text
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '—');
    if numeric {
        format!("<td class=\"num\">{}</td>", escape(text))
    } else {
        format!("<td>{}</td>", escape(text))
    }
}

pub fn render(report: &Report) -> Result<String> {
    let mut page = String::new();
    let m = &report.machine;
    let s = &report.scale;
    write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>locus report, {date}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>locus report</h1>\n<p>Generated {date} by locus {version} in {elapsed:.0} s \
         ({mode}: {seconds} s per measured case). Each section runs a small version of one \
         seed paper's headline experiment on this machine and sets the paper's claim beside \
         what was measured; <code>report.json</code> beside this page holds every case the \
         plots and tables were drawn from.</p>\n",
        date = escape(&report.generated_utc),
        version = escape(report.locus_version),
        elapsed = report.elapsed_seconds,
        mode = if s.quick { "quick" } else { "full" },
        seconds = s.seconds,
    )?;
    writeln!(
        page,
        "<table class=\"machine\"><caption>The machine</caption>\
         <tr><th>CPU</th><td>{}</td></tr>\
         <tr><th>CPUs</th><td>{}</td></tr>\
         <tr><th>NUMA nodes</th><td>{}</td></tr>\
         <tr><th>memory</th><td>{}</td></tr>\
         <tr><th>persistent-memory devices</th><td>{}</td></tr>\
         <tr><th>kernel</th><td>{}</td></tr></table>",
        escape(&m.cpu_model),
        m.cpus,
        m.numa_nodes,
        escape(&crate::size::format_bytes(m.memory_bytes)),
        if m.pmem_devices == 0 {
            "none (emulated on DRAM: files on tmpfs bound to their node)".to_owned()
        } else {
            m.pmem_devices.to_string()
        },
        escape(&m.kernel),
    )?;

    page.push_str(
        "<table class=\"summary\"><caption>Summary</caption>\
         <tr><th>section</th><th>comparison</th><th>paper</th><th>here</th></tr>\n",
    );
    for section in &report.sections {
        for f in &section.findings {
            writeln!(
                page,
                "<tr><td><a href=\"#{id}\">{title}</a></td><td>{what}</td><td>{paper}</td>\
                 <td>{here}</td></tr>",
                id = section_anchor(section),
                title = escape(section.title.split(':').next().unwrap_or(section.title)),
                what = escape(&f.what),
                paper = escape(f.paper.as_deref().unwrap_or("—")),
                here = escape(&f.here),
            )?;
        }
        if section.findings.is_empty() {
            writeln!(
                page,
                "<tr><td><a href=\"#{}\">{}</a></td><td colspan=\"3\">not measured</td></tr>",
                section_anchor(section),
                escape(section.title)
            )?;
        }
    }
    page.push_str("</table>\n");

    let mut figures = 0;
    for section in &report.sections {
        render_section(&mut page, section, &mut figures)?;
    }
    page.push_str("</body>\n</html>\n");
    Ok(page)
}

fn section_anchor(section: &Section) -> &'static str {
    match section.id {
        super::SectionId::MbsLvm => "mbs-lvm",
        super::SectionId::Libpubl => "libpubl",
        super::SectionId::Tyche => "tyche",
        super::SectionId::Nbm => "nbm",
        super::SectionId::Udma => "udma",
    }
}

fn render_section(page: &mut String, section: &Section, figures: &mut usize) -> Result<()> {
    write!(
        page,
        "<section id=\"{}\">\n<h2>{}</h2>\n<p class=\"paper\">{}</p>\n\
         <p><b>The paper:</b> {}</p>\n",
        section_anchor(section),
        escape(section.title),
        escape(section.paper),
        escape(section.claim),
    )?;
    if !section.findings.is_empty() {
        page.push_str(
            "<table class=\"findings\"><caption>Paper and this machine</caption>\
             <tr><th>comparison</th><th>paper</th><th>here</th></tr>\n",
        );
        for f in &section.findings {
            writeln!(
                page,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&f.what),
                escape(f.paper.as_deref().unwrap_or("—")),
                escape(&f.here)
            )?;
        }
        page.push_str("</table>\n");
    }
    if !section.notes.is_empty() {
        page.push_str("<ul class=\"notes\">\n");
        for note in &section.notes {
            let class = if note.starts_with("Not measured") {
                " class=\"error\""
            } else {
                ""
            };
            writeln!(page, "<li{class}>{}</li>", prose(note))?;
        }
        page.push_str("</ul>\n");
    }
    for figure in &section.figures {
        let (r, g, b) = frame_colour(*figures);
        *figures += 1;
        write!(
            page,
            "<figure class=\"plot\" style=\"border-color: rgb({r}, {g}, {b})\">\n{}\n\
             <figcaption>{}</figcaption>\n</figure>\n",
            figure.svg.trim(),
            escape(&figure.caption)
        )?;
    }
    for table in &section.tables {
        render_table(page, table)?;
    }
    let total: f64 = section.runs.iter().map(|r| r.seconds).sum();
    writeln!(
        page,
        "<details><summary>How this was measured ({} run(s), {total:.0} s)</summary><ul>",
        section.runs.len()
    )?;
    for run in &section.runs {
        writeln!(
            page,
            "<li>{}: <code>{}</code> ({:.1} s, {} case(s){})</li>",
            escape(&run.label),
            escape(&run.command),
            run.seconds,
            run.cases.len(),
            run.error
                .as_deref()
                .map_or_else(String::new, |e| format!("; failed: {}", escape(e)))
        )?;
    }
    page.push_str("</ul></details>\n</section>\n");
    Ok(())
}

fn render_table(page: &mut String, table: &Table) -> Result<()> {
    write!(
        page,
        "<table class=\"data\"><caption>{}</caption>\n<tr>",
        escape(&table.caption)
    )?;
    for head in &table.head {
        write!(page, "<th>{}</th>", escape(head))?;
    }
    page.push_str("</tr>\n");
    for row in &table.rows {
        page.push_str("<tr>");
        for value in row {
            page.push_str(&cell(value));
        }
        page.push_str("</tr>\n");
    }
    page.push_str("</table>\n");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup_and_code_spans_are_set() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(prose("run `a<b` now"), "run <code>a&lt;b</code> now");
    }

    #[test]
    fn every_plot_gets_its_own_frame_colour() {
        let colours: std::collections::HashSet<_> = (0..40).map(frame_colour).collect();
        assert_eq!(colours.len(), 40);
    }
}

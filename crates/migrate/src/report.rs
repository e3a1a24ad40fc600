//! `report.json` (everything) and `report.html` (self-contained, for a person).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::flow::MigrateReport;
use crate::reports::Outcome;

pub fn write(out: &Path, report: &MigrateReport) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(out.join("report.json"), json)?;
    let patches: BTreeMap<String, String> = report
        .plans
        .iter()
        .filter_map(|p| {
            let file = p.patch_file.as_ref()?;
            let text = std::fs::read_to_string(out.join(file)).ok()?;
            Some((p.plan.clone(), text))
        })
        .collect();
    std::fs::write(out.join("report.html"), html(report, &patches))
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// A unified diff, coloured by line.
fn diff_html(diff: &str) -> String {
    let mut h = String::from("<pre class=diff>");
    for line in diff.lines() {
        let cls = if line.starts_with("+++") || line.starts_with("---") || line.starts_with("diff ")
        {
            "file"
        } else if line.starts_with('+') {
            "add"
        } else if line.starts_with('-') {
            "del"
        } else if line.starts_with("@@") {
            "hunk"
        } else {
            ""
        };
        let _ = writeln!(h, "<span class=\"{cls}\">{}</span>", esc(line));
    }
    h + "</pre>"
}

const STYLE: &str = "
*{box-sizing:border-box} body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;padding:1.5em;max-width:1240px;color:#222}
h1{font-size:1.5em;margin:.2em 0} h2{font-size:1.2em;margin:1.4em 0 .4em} h3{font-size:1.05em;margin:1em 0 .3em}
table{border-collapse:collapse;width:100%;table-layout:fixed} td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top;overflow-wrap:anywhere;text-align:left}
th{background:#f3f4f6} col.plan{width:22%} col.verdict{width:38%} col.n{width:8%} col.cost{width:8%}
.ok{color:#176f2c;font-weight:bold} .no{color:#b00020;font-weight:bold} small{color:#555}
pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:32em;white-space:pre-wrap;overflow-wrap:anywhere;margin:.3em 0}
.add{color:#176f2c} .del{color:#b00020} .hunk{color:#6f42c1} .file{font-weight:bold}
.bar{height:12px;background:#4a7fd4;display:inline-block;vertical-align:middle;margin-right:6px}
details{margin:.4em 0} summary{cursor:pointer} section.plan{border-top:1px solid #ddd;padding-top:.4em}
code{overflow-wrap:anywhere}
";

pub fn html(r: &MigrateReport, patches: &BTreeMap<String, String>) -> String {
    let mut h = String::new();
    head(&mut h, r);
    winner(&mut h, r);
    plans_table(&mut h, r);
    for p in &r.plans {
        plan_section(&mut h, r, p, patches);
    }
    phases(&mut h, r);
    h.push_str("</body></html>\n");
    h
}

/// Tests that passed in `res`.
fn passed(res: &crate::reports::Results) -> usize {
    res.values().filter(|o| **o == Outcome::Passed).count()
}

/// The page's head, title and what the baseline was.
fn head(h: &mut String, r: &MigrateReport) {
    let _ = write!(
        h,
        "<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content=\"width=device-width\"><title>forkbox migrate: {from} → {to}</title><style>{STYLE}</style></head><body>
<h1>Migration {from} → {to}</h1>
<p>Test command <code>{test}</code>; accelerator {accel}. Baseline on the old toolchain: {counts} ({bp} of {bt} tests passed; {runs} runs, {flaky} flaky; tests in {order}; results read from {source}). Report schema {schema}, forkbox {version}.</p>",
        from = esc(&r.from),
        to = esc(&r.to),
        test = esc(&r.test),
        accel = esc(&r.accelerator),
        counts = crate::reports::Counts::of(&r.baseline.results),
        source = esc(&r.results_source),
        order = esc(&r.baseline_order),
        bp = passed(&r.baseline.results),
        bt = r.baseline.results.len(),
        runs = r.baseline_runs,
        flaky = r.baseline.flaky.len(),
        schema = r.schema_version,
        version = esc(&r.forkbox_version),
    );
}

/// The accepted plan, and why, or that none was.
fn winner(h: &mut String, r: &MigrateReport) {
    match &r.winner {
        Some(w) => {
            let why = r
                .verdicts
                .iter()
                .find(|v| &v.plan == w)
                .and_then(|v| v.rank_reason.clone())
                .unwrap_or_default();
            let patch = match &r.winner_patch {
                Some(p) => format!(
                    "Its patch is <code>{0}</code> (<code>git apply {0}</code>).",
                    esc(p)
                ),
                None => "It changes nothing: the code passes as it is.".into(),
            };
            let _ = write!(
                h,
                "<h2 class=ok id=winner>Winner: {}</h2><p>{}. {patch}</p>",
                esc(w),
                esc(&why)
            );
        }
        None => h.push_str("<h2 class=no id=winner>No plan was accepted</h2>"),
    }
}

/// A row per plan: its verdict, counts, diff size, times and cost.
fn plans_table(h: &mut String, r: &MigrateReport) {
    h.push_str("<h2>Plans</h2><table id=plans><colgroup><col class=plan><col class=verdict><col class=n><col class=n><col class=n><col class=n><col class=n><col class=cost></colgroup><tr><th>plan</th><th>verdict, and why</th><th>passed</th><th>lost</th><th>fixed</th><th>diff lines</th><th>port / tests</th><th>cost</th></tr>");
    for p in &r.plans {
        let v = p.verdict.as_ref();
        let accepted = v.is_some_and(|v| v.accepted);
        let why = match v {
            Some(v) => match (&v.rank, &v.rank_reason) {
                (Some(rank), Some(rr)) => format!("rank {rank}: {rr}; {}", v.reason),
                _ => v.reason.clone(),
            },
            None => "not judged".into(),
        };
        let _ = write!(
            h,
            "<tr><td><b><a href=\"#plan-{anchor}\">{name}</a></b><br><small>{instr}</small><br><small>porter: {porter}{llm}</small></td><td><span class={cls}>{verdict}</span><br><small>{why}</small></td><td>{passed}</td><td>{lost}</td><td>{fixed}</td><td>{diff}</td><td>{port}<br>{tests}</td><td>${cost:.4}<br><small>{cpu:.1} CPU s</small></td></tr>",
            anchor = esc(&p.plan),
            name = esc(&p.plan),
            instr = esc(&p.instructions),
            porter = esc(&p.porter),
            llm = match (p.porter_steps, p.llm_tokens) {
                (Some(s), Some(t)) => format!(
                    "; {s} model calls, {t} tokens{}",
                    p.transcript_file
                        .as_deref()
                        .map(|f| format!(", <a href=\"{}\">conversation</a>", esc(f)))
                        .unwrap_or_default()
                ),
                _ => String::new(),
            },
            cls = if accepted { "ok" } else { "no" },
            verdict = if accepted { "accepted" } else { "rejected" },
            why = esc(&why),
            passed = passed(&p.results),
            lost = v.map_or(0, |v| v.lost.len()),
            fixed = v.map_or(0, |v| v.fixed.len()),
            diff = p.diff_lines,
            port = secs(p.porter_ms),
            tests = secs(p.test_ms),
            cost = p.cost,
            cpu = p.cpu_seconds,
        );
    }
    h.push_str("</table><p><small>Cost: the plan's sandbox CPU and memory time at the run's rates, in US dollars.</small></p>");
}

/// One plan's section: its failure, lost/flaky/fixed tests, patch and output tails.
fn plan_section(
    h: &mut String,
    r: &MigrateReport,
    p: &crate::flow::PlanRun,
    patches: &BTreeMap<String, String>,
) {
    let _ = write!(
        h,
        "<section class=plan id=\"plan-{}\"><h3>{}</h3>",
        esc(&p.plan),
        esc(&p.plan)
    );
    if let Some(f) = &p.failure {
        let _ = write!(h, "<p class=no>{}</p>", esc(f));
    }
    if let Some(v) = &p.verdict {
        if !v.lost.is_empty() {
            let _ = write!(h, "<details open class=lost><summary>{} lost test(s): passed before, not now</summary>", v.lost.len());
            for id in &v.lost {
                let _ = write!(h, "<div class=lost-test><code>{}</code>", esc(id));
                match p.failures.get(id) {
                    Some(out) => {
                        let _ = write!(h, "<pre>{}</pre>", esc(out));
                    }
                    None => h.push_str(
                        " <small>(no failure output of its own; see the test output below)</small>",
                    ),
                }
                h.push_str("</div>");
            }
            h.push_str("</details>");
        }
        if !v.flaky_lost.is_empty() {
            let _ = write!(
                h,
                "<details open class=lost><summary>{} test(s) lost, flaky: failed in the plan's run, passed when run again{} (not counted)</summary><ul>",
                v.flaky_lost.len(),
                if p.rerun.as_ref().is_some_and(|r| r.alone) { " alone" } else { " with the whole suite" }
            );
            for id in &v.flaky_lost {
                let _ = write!(h, "<li><code>{}</code></li>", esc(id));
            }
            h.push_str("</ul></details>");
        }
        if let Some(e) = p.rerun.as_ref().and_then(|r| r.error.as_ref()) {
            let _ = write!(
                h,
                "<p class=no>Its lost tests could not be run again ({}): they stay lost.</p>",
                esc(e)
            );
        }
        if !v.fixed.is_empty() {
            let _ = write!(
                h,
                "<details><summary>{} fixed test(s)</summary><ul>",
                v.fixed.len()
            );
            for id in &v.fixed {
                let _ = write!(h, "<li><code>{}</code></li>", esc(id));
            }
            h.push_str("</ul></details>");
        }
    }
    match patches.get(&p.plan) {
        Some(diff) => {
            let _ = write!(
                h,
                "<details class=patch{}><summary>patch: {} lines changed (<code>{}</code>)</summary>{}</details>",
                if r.winner.as_deref() == Some(p.plan.as_str()) { " open" } else { "" },
                p.diff_lines,
                esc(p.patch_file.as_deref().unwrap_or("")),
                diff_html(diff)
            );
        }
        None => h.push_str("<p><small>No patch: the plan changed nothing.</small></p>"),
    }
    if !p.test_output_tail.is_empty() {
        let _ = write!(
            h,
            "<details><summary>last lines of its test run</summary><pre>{}</pre></details>",
            esc(&p.test_output_tail)
        );
    }
    if !p.porter_output_tail.is_empty() {
        let _ = write!(
            h,
            "<details><summary>last lines of its porter</summary><pre>{}</pre></details>",
            esc(&p.porter_output_tail)
        );
    }
    h.push_str("</section>");
}

/// The time per phase, as bars.
fn phases(h: &mut String, r: &MigrateReport) {
    h.push_str("<h2>Time per phase</h2><table id=phases><colgroup><col style=\"width:30%\"><col></colgroup>");
    let ph = &r.phases;
    let max = [
        ph.baseline_ms,
        ph.prepare_ms,
        ph.fork_ms,
        ph.port_ms,
        ph.verify_ms,
    ]
    .into_iter()
    .max()
    .unwrap_or(1)
    .max(1);
    for (name, v) in [
        ("baseline (runs side by side)", ph.baseline_ms),
        ("prepare + snapshot (beside the baseline)", ph.prepare_ms),
        ("fork", ph.fork_ms),
        ("port (slowest plan)", ph.port_ms),
        ("verify (slowest plan)", ph.verify_ms),
    ] {
        let _ = write!(
            h,
            "<tr><td>{name}</td><td><span class=bar style=\"width:{}px\"></span>{}</td></tr>",
            v * 600 / max,
            secs(v)
        );
    }
    let _ = write!(
        h,
        "</table><p>Wall time {}. The test-suite runs took {} of sandbox time in all; runs side by side overlap, so that can exceed the wall time.</p>",
        secs(ph.total_ms),
        secs(ph.test_suite_ms)
    );
}

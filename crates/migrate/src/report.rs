//! `report.json` (everything) and `report.html` (self-contained, for a person).

use std::fmt::Write as _;
use std::path::Path;

use crate::flow::MigrateReport;
use crate::reports::Outcome;

pub fn write(out: &Path, report: &MigrateReport) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(out.join("report.json"), json)?;
    let winner_diff = report
        .winner_patch
        .as_ref()
        .and_then(|p| std::fs::read_to_string(out.join(p)).ok())
        .unwrap_or_default();
    std::fs::write(out.join("report.html"), html(report, &winner_diff))
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        return "<em>none</em>".into();
    }
    let mut s = String::from("<ul>");
    for i in items {
        let _ = write!(s, "<li><code>{}</code></li>", esc(i));
    }
    s + "</ul>"
}

pub fn html(r: &MigrateReport, winner_diff: &str) -> String {
    let mut h = String::new();
    let passed =
        |res: &crate::reports::Results| res.values().filter(|o| **o == Outcome::Passed).count();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=utf-8><title>forkbox migrate: {from} → {to}</title><style>
body{{font:14px system-ui,sans-serif;margin:2em;color:#222}} table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}
.ok{{color:#176f2c;font-weight:bold}} .no{{color:#b00020;font-weight:bold}} pre{{background:#f6f8fa;padding:8px;overflow:auto}}
.add{{color:#176f2c}} .del{{color:#b00020}} .hunk{{color:#6f42c1}} .bar{{height:14px;background:#4a7fd4;display:inline-block}}
</style></head><body><h1>Migration {from} → {to}</h1>
<p>Test command <code>{test}</code>; accelerator {accel}. Baseline on the old toolchain: {counts} ({bp} of {bt} tests passed; {runs} runs, {flaky} flaky; results read from {source}).</p>",
        from = esc(&r.from),
        to = esc(&r.to),
        test = esc(&r.test),
        accel = esc(&r.accelerator),
        counts = crate::reports::Counts::of(&r.baseline.results),
        source = esc(&r.results_source),
        bp = passed(&r.baseline.results),
        bt = r.baseline.results.len(),
        runs = r.baseline_runs,
        flaky = r.baseline.flaky.len(),
    );
    match &r.winner {
        Some(w) => {
            let _ = write!(h, "<h2 class=ok>Winner: {}</h2><p>Its patch is <code>winner.patch</code> (<code>git apply winner.patch</code>).</p>", esc(w));
        }
        None => h.push_str("<h2 class=no>No plan was accepted</h2>"),
    }
    h.push_str("<h2>Plans</h2><table><tr><th>plan</th><th>verdict</th><th>rank</th><th>passed</th><th>lost</th><th>fixed</th><th>diff lines</th><th>port</th><th>tests</th><th>CPU s</th><th>cost</th></tr>");
    for p in &r.plans {
        let v = r.verdicts.iter().find(|v| v.plan == p.plan);
        let (accepted, reason, lost, fixed, rank) = match v {
            Some(v) => (
                v.accepted,
                v.reason.clone(),
                v.lost.clone(),
                v.fixed.clone(),
                v.rank,
            ),
            None => (false, "not judged".into(), vec![], vec![], None),
        };
        let _ = write!(
            h,
            "<tr><td><b>{name}</b><br><small>{instr}</small><br><small>porter: {porter}{llm}</small></td><td class={cls}>{verdict}<br><small>{reason}</small></td><td>{rank}</td><td>{passed}</td><td>{lost}</td><td>{fixed}</td><td>{diff}</td><td>{port} ms</td><td>{tests} ms</td><td>{cpu:.1}</td><td>{cost:.4}</td></tr>",
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
            reason = esc(&reason),
            rank = rank.map(|r| r.to_string()).unwrap_or_else(|| "–".into()),
            passed = passed(&p.results),
            lost = list(&lost),
            fixed = list(&fixed),
            diff = p.diff_lines,
            port = p.porter_ms,
            tests = p.test_ms,
            cpu = p.cpu_seconds,
            cost = p.cost,
        );
    }
    h.push_str("</table><h2>Time per phase</h2><table>");
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
        ("baseline", ph.baseline_ms),
        ("prepare + snapshot", ph.prepare_ms),
        ("fork", ph.fork_ms),
        ("port (slowest plan)", ph.port_ms),
        ("verify (slowest plan)", ph.verify_ms),
    ] {
        let _ = write!(
            h,
            "<tr><td>{name}</td><td><span class=bar style=\"width:{}px\"></span> {v} ms</td></tr>",
            v * 400 / max
        );
    }
    let _ = write!(
        h,
        "</table><p>Total {} ms, of which test-suite runs {} ms.</p>",
        ph.total_ms, ph.test_suite_ms
    );
    if !winner_diff.is_empty() {
        h.push_str("<h2>Winning patch</h2><pre>");
        for line in winner_diff.lines() {
            let cls = if line.starts_with("+++")
                || line.starts_with("---")
                || line.starts_with("diff ")
            {
                ""
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
        h.push_str("</pre>");
    }
    h.push_str("</body></html>\n");
    h
}

//! Progress on stderr for commands that take a while: a labelled bar when the amount of work
//! is known, a spinner with the elapsed time when it is not. Drawn only when stderr is a
//! terminal (and never with `--json`), so logs and pipes get none of it.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

fn shown(visible: bool) -> bool {
    visible && std::io::IsTerminal::is_terminal(&std::io::stderr())
}

/// A bar over `total` steps counted in `unit` ("grid points", "runs"); the step in progress
/// goes in the message (`bar.set_message(...)`).
pub fn steps(total: u64, unit: &str, visible: bool) -> ProgressBar {
    bar(
        total,
        &format!("{{bar:30}} {{pos}}/{{len}} {unit}, {{elapsed}} elapsed, {{eta}} left  {{msg}}"),
        visible,
    )
}

/// A bar over `total` bytes (reading a file).
pub fn bytes(total: u64, what: &str, visible: bool) -> ProgressBar {
    bar(
        total,
        &format!("{what} {{bar:30}} {{bytes}}/{{total_bytes}}, {{eta}} left"),
        visible,
    )
}

fn bar(total: u64, template: &str, visible: bool) -> ProgressBar {
    if !shown(visible) {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(ProgressStyle::with_template(template).expect("valid template"));
    bar
}

/// A spinner for work of unknown length: `message (12s)`.
pub fn spinner(message: String, visible: bool) -> ProgressBar {
    if !shown(visible) {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"),
    );
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

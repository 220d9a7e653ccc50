//! `train --tui` as a person sees it: the run under tmux, the screen read with `capture-pane`,
//! keys pressed with `send-keys`. Without tmux the test says so and stops (CI installs it and
//! sets `QWEN_BURN_REQUIRE_TMUX=1`, which makes a missing tmux a failure).

mod common;
use common::*;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmux server of this test's own (`-L`), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn available() -> bool {
        let found = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found && std::env::var_os("QWEN_BURN_REQUIRE_TMUX").is_some() {
            panic!("tmux is not installed and QWEN_BURN_REQUIRE_TMUX is set");
        }
        found
    }

    /// `command` in a detached 180 x 45 terminal; the shell stays open after it exits.
    fn start(name: &str, command: &str) -> Self {
        let tmux = Self {
            socket: format!("qwen-burn-{name}-{}", std::process::id()),
        };
        let shell = format!("{command}; echo EXIT=$?; sleep 600");
        tmux.run(&[
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "180",
            "-y",
            "45",
            "-c",
            s(&repo_root()),
            &shell,
        ]);
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("tmux runs");
        assert!(out.status.success(), "tmux {args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "t"])
    }

    fn keys(&self, keys: &str) {
        self.run(&["send-keys", "-t", "t", keys]);
    }

    /// The screen once `ready` holds for it (panics with the last screen after 60 s).
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "waited 60 s for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Press the stop key (`q`, then `s` in its popup) and return the screen after the exit.
    fn stop(&self) -> String {
        self.keys("q");
        self.wait_for("the stop popup", |s| s.contains("Cancel the action"));
        self.keys("s");
        self.wait_for("the run to exit", |s| s.contains("EXIT="))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

/// The number after `label` on the screen (`label` followed by spaces and digits).
fn number_after(screen: &str, label: &str) -> Option<usize> {
    let rest = &screen[screen.find(label)? + label.len()..];
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The tiny config with a constant learning rate after warmup, so that a run's steps do not
/// depend on its horizon (`--max-steps`) and runs of different lengths can be compared.
fn config(dir: &Path) -> std::path::PathBuf {
    let path = tiny_config(dir, false, 100_000, 50, "");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("min_lr = 1e-4", "min_lr = 1e-4\ndecay = \"constant\"");
    std::fs::write(&path, text).unwrap();
    path
}

fn train_cmd(config: &Path, run: &Path, extra: &str) -> String {
    format!(
        "env QWEN_BURN_CACHE_DIR={} {} train --config {} --run-dir {} --tui {extra}",
        Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("qwen-burn-cache")
            .display(),
        env!("CARGO_BIN_EXE_qwen-burn"),
        config.display(),
        run.display()
    )
}

#[test]
fn the_dashboard_shows_the_run_and_its_stop_key_leaves_a_checkpoint_that_resumes_bit_for_bit() {
    if !Tmux::available() {
        eprintln!("SKIPPED: tmux is not installed (CI installs it)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let config = config(tmp.path());
    let run = tmp.path().join("run");

    // 1. The dashboard: every metric's tab, the text panel, progress; stopped at step N.
    let tmux = Tmux::start("first", &train_cmd(&config, &run, ""));
    let screen = tmux.wait_for("a validation loss on the dashboard", |s| {
        s.contains("Valid") && number_after(s, "Items  :").is_some_and(|n| n >= 60)
    });
    for tab in [
        "Loss",
        "Learning rate",
        "Gradient norm",
        "Tokens/s",
        "MFU",
        "Bits per byte",
    ] {
        assert!(screen.contains(tab), "no {tab} tab:\n{screen}");
    }
    for text in ["Train", "Valid", "Step", "Progress", "Mode   : Training"] {
        assert!(screen.contains(text), "no {text}:\n{screen}");
    }
    let after = tmux.stop();
    assert!(after.contains("EXIT=0"), "{after}");
    let stopped = number_after(&after, "stopped:").expect("stopped: N steps");
    assert!(after.contains("train.log"), "{after}");
    let checkpoint = run.join(format!("checkpoints/step-{stopped:08}"));
    assert!(checkpoint.join("state.json").exists(), "{after}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("stopped by the dashboard's stop key"), "{log}");
    drop(tmux);

    // 2. Resumed under the dashboard: the bar starts where the run stands, and the plots hold
    //    the first part again (replayed from metrics.jsonl).
    let tmux = Tmux::start("resume", &train_cmd(&config, &run, "--resume"));
    let screen = tmux.wait_for("the resumed run's progress", |s| {
        s.contains("Valid") && number_after(s, "Epochs :").is_some_and(|e| e >= 2)
    });
    let epochs = number_after(&screen, "Epochs :").unwrap();
    let per_epoch = screen
        .split("Items  :")
        .nth(1)
        .and_then(|r| r.split('/').nth(1))
        .and_then(|r| r.trim().split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|d| d.parse::<usize>().ok())
        .expect("Items: i/n");
    assert!(
        (epochs - 1) * per_epoch >= stopped,
        "the bar restarted: epoch {epochs} of {per_epoch} steps, stopped at {stopped}:\n{screen}"
    );
    let after = tmux.stop();
    assert!(after.contains("EXIT=0"), "{after}");
    let resumed = number_after(&after, "stopped:").expect("stopped: N steps");
    assert!(resumed > stopped, "{after}");
    drop(tmux);

    // 3. The same steps without stops or a dashboard give the same losses, bit for bit.
    let reference = tmp.path().join("reference");
    ok(&qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&reference),
            "--max-steps",
            &resumed.to_string(),
        ],
        &[],
    ));
    let (ours, theirs) = (train_losses(&run), train_losses(&reference));
    assert_eq!(ours.len(), resumed, "one record a step");
    assert_eq!(ours, theirs, "stopped and resumed under the dashboard");
}

#[test]
fn without_a_terminal_the_dashboard_falls_back_to_lines_with_a_notice() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_config(tmp.path(), false, 3, 3, "");
    let out = qwen_burn(
        &[
            "train",
            "--config",
            s(&config),
            "--run-dir",
            s(&tmp.path().join("run")),
            "--tui",
        ],
        &[],
    );
    let text = ok(&out);
    assert!(text.contains("needs a terminal"), "{text}");
    assert!(text.contains("step      3/3 | loss"), "{text}");
    assert!(text.contains("done: 3 steps"), "{text}");
}

/// SIGTERM (or SIGINT) under the dashboard: the run stops at the end of its step with a
/// checkpoint, the terminal is given back (cooked mode, main screen, mouse released) and the
/// exit code is 128 + the signal.
#[test]
fn a_signal_under_the_dashboard_checkpoints_and_gives_the_terminal_back() {
    if !Tmux::available() {
        eprintln!("SKIPPED: tmux is not installed (CI installs it)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let config = config(tmp.path());
    for (signal, code) in [("TERM", 143), ("INT", 130)] {
        let run = tmp.path().join(format!("run-{signal}"));
        let command = format!(
            "{}; code=$?; if stty -a | grep -q -- -icanon; then echo MODE=raw; else echo MODE=icanon; fi; (exit $code)",
            train_cmd(&config, &run, "")
        );
        let tmux = Tmux::start(&format!("signal-{signal}"), &command);
        tmux.wait_for("a few steps", |s| {
            number_after(s, "Items  :").is_some_and(|n| n >= 5)
        });
        let pid = tmux.run(&["list-panes", "-t", "t", "-F", "#{pane_pid}"]);
        // The pane's shell runs qwen-burn as its child.
        let out = Command::new("pkill")
            .args([&format!("-{signal}"), "-P", pid.trim(), "-f", "qwen-burn"])
            .output()
            .expect("pkill runs");
        assert!(out.status.success(), "pkill: {}", stderr(&out));
        let after = tmux.wait_for("the run to exit", |s| s.contains("MODE="));
        assert!(after.contains(&format!("EXIT={code}")), "{signal}: {after}");
        assert!(
            after.contains("MODE=icanon"),
            "{signal}: the terminal stays raw:\n{after}"
        );
        let stopped = number_after(&after, "stopped:").expect("stopped: N steps");
        let checkpoint = run.join(format!("checkpoints/step-{stopped:08}"));
        assert!(checkpoint.join("state.json").exists(), "{signal}: {after}");
        let log = std::fs::read_to_string(run.join("train.log")).unwrap();
        assert!(log.contains(&format!("stopped by SIG{signal}")), "{log}");
    }
}

//! The reward functions of an RL run (`[[rl.rewards]]`): `exact_match` (the completion's final
//! answer against the reference's), `regex` (1 when a pattern matches) and `command` (a user's
//! program that scores JSON lines on its stdin, one number per line on its stdout).

use std::io::{self, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::LazyLock;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use regex::Regex;

/// An error of a reward function (all come from `command`). The first field is the program as
/// configured; a `String` last holds the last 10 lines of its stderr.
#[derive(Debug, thiserror::Error)]
pub enum RewardError {
    /// The program could not be started.
    #[error("reward command `{0}`: cannot start it: {1}")]
    Spawn(String, #[source] io::Error),
    /// It ran past its timeout and was killed.
    #[error(
        "reward command `{0}` ran past its timeout of {secs} s and was killed{tail}",
        secs = .1.as_secs_f64(), tail = tail(.2)
    )]
    Timeout(String, Duration, String),
    /// It exited with a non-zero status or was ended by a signal (as the OS words it).
    #[error("reward command `{0}` failed ({1}){tail}", tail = tail(.2))]
    Failed(String, String, String),
    /// It wrote `.2` lines for `.1` completions.
    #[error("reward command `{0}` wrote {2} lines for {1} completions{tail}", tail = tail(.3))]
    LineCount(String, usize, usize, String),
    /// Its output's line `.1` (1-based), `.2`, is not a finite number.
    #[error("reward command `{0}`: line {1} of its output is not a finite number: {2:?}")]
    BadLine(String, usize, String),
}

/// The end of an error message that quotes `stderr`, when it holds something.
fn tail(stderr: &str) -> String {
    match stderr.trim_end() {
        "" => String::new(),
        stderr => format!("; its stderr ends with:\n{stderr}"),
    }
}

/// One completion to score.
#[derive(Debug, Clone, Copy)]
pub struct Scored<'a> {
    /// The prompt, as the model saw it.
    pub prompt: &'a str,
    /// The generated completion.
    pub completion: &'a str,
    /// The reference answer of the prompt's row.
    pub answer: &'a str,
}

/// A reward function of an RL run (config: `[[rl.rewards]] kind = "exact_match" | "regex" |
/// "command"`).
#[derive(Debug, Clone)]
pub enum Reward {
    /// 1 when the completion's final answer equals the reference answer's, else 0; both come
    /// from [`extract_answer`] with `pattern` ([`Reward::GSM8K_PATTERN`] by default), so GSM8K's
    /// `...#### 72` and a plain `72` both work as references (one without an answer is taken
    /// whole). Numbers compare without commas and trailing fractional zeros (`1,000` == `1000`,
    /// `72.0` == `72`), other answers trimmed. No answer in the completion gives 0.
    ExactMatch { pattern: Regex },
    /// 1 when `pattern` matches anywhere in the completion, else 0.
    Regex { pattern: Regex },
    /// A user's program (found on `PATH` without a slash), started once per call of
    /// [`Reward::score`] with `args` (no shell). It reads JSON lines `{"prompt": ...,
    /// "completion": ..., "answer": ...}` on stdin, one per completion in order, and writes one
    /// finite number per line on stdout (whitespace around it allowed). A non-zero exit, a
    /// signal, running past `timeout` (it is killed), a wrong number of lines or a line that is
    /// not a finite number is an error; the last lines of its stderr end the message.
    Command {
        program: String,
        args: Vec<String>,
        timeout: Duration,
    },
}

impl Reward {
    /// The built-in pattern of exact_match: GSM8K's `#### N`.
    pub const GSM8K_PATTERN: &'static str = r"#### (-?[0-9][0-9,]*\.?[0-9]*)";

    /// Rewards of `items`, one per item, in order.
    pub fn score(&self, items: &[Scored<'_>]) -> Result<Vec<f64>, RewardError> {
        let hits = |hit: &dyn Fn(&Scored<'_>) -> bool| {
            Ok(items.iter().map(|x| f64::from(u8::from(hit(x)))).collect())
        };
        match self {
            Reward::ExactMatch { pattern } => hits(&|item| exact_match(item, pattern)),
            Reward::Regex { pattern } => hits(&|item| pattern.is_match(item.completion)),
            Reward::Command { .. } if items.is_empty() => Ok(Vec::new()),
            Reward::Command {
                program,
                args,
                timeout,
            } => run_command(program, args, *timeout, items),
        }
    }

    /// Short name for metrics: `exact_match`, `regex`, `command`.
    pub fn kind(&self) -> &'static str {
        match self {
            Reward::ExactMatch { .. } => "exact_match",
            Reward::Regex { .. } => "regex",
            Reward::Command { .. } => "command",
        }
    }
}

/// A number, as exact_match finds one when its pattern does not match.
static NUMBER: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"-?[0-9][0-9,]*\.?[0-9]*").ok());

/// The final answer of a text as exact_match extracts it (None when none): the first capture
/// group of `pattern` (the whole match when it has none) at its last match; when `pattern` does
/// not match, the last number of the text (`-?[0-9][0-9,]*\.?[0-9]*`). Not normalised.
pub fn extract_answer(text: &str, pattern: &Regex) -> Option<String> {
    let found = match pattern.captures_iter(text).last() {
        Some(caps) => caps.get(1).or_else(|| caps.get(0)),
        None => NUMBER.as_ref()?.find_iter(text).last(),
    };
    found.map(|m| m.as_str().to_string())
}

/// An answer as exact_match compares it: trimmed; a number also without commas and without
/// trailing fractional zeros and point.
fn normalize(answer: &str) -> String {
    let answer = answer.trim();
    let number = NUMBER.as_ref().and_then(|number| number.find(answer));
    if number.is_none_or(|number| number.as_str() != answer) {
        return answer.to_string();
    }
    let digits: String = answer.chars().filter(|c| *c != ',').collect();
    if !digits.contains('.') {
        return digits;
    }
    digits.trim_end_matches('0').trim_end_matches('.').into()
}

/// Whether the completion's final answer is the reference's.
fn exact_match(item: &Scored<'_>, pattern: &Regex) -> bool {
    let Some(got) = extract_answer(item.completion, pattern) else {
        return false;
    };
    let expected = extract_answer(item.answer, pattern).unwrap_or_else(|| item.answer.into());
    normalize(&got) == normalize(&expected)
}

/// One JSON line of a command's stdin.
fn json_line(item: &Scored<'_>) -> String {
    let (prompt, completion, answer) = (item.prompt, item.completion, item.answer);
    let line = serde_json::json!({"prompt": prompt, "completion": completion, "answer": answer});
    format!("{line}\n")
}

/// Everything `pipe` gives until it closes, read by a thread of its own.
fn read_all(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = tx.send(bytes);
        });
    }
    rx
}

/// Runs a `command` reward (see [`Reward::Command`]). Stdin is written, stdout and stderr read,
/// by threads of their own, so that no pipe can block another. On a timeout the child is killed
/// and reaped without waiting for them (a grandchild that holds a pipe, which is not killed,
/// holds them until it ends).
fn run_command(
    program: &str,
    args: &[String],
    timeout: Duration,
    items: &[Scored<'_>],
) -> Result<Vec<f64>, RewardError> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(Instant::now());
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::piped());
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let name = || program.to_string();
    let mut child = command.spawn().map_err(|e| RewardError::Spawn(name(), e))?;
    let input: String = items.iter().map(json_line).collect();
    if let Some(mut stdin) = child.stdin.take() {
        // A write error (the program exited without reading everything) is left to its status
        // and its lines to judge.
        thread::spawn(move || stdin.write_all(input.as_bytes()));
    }
    let (stdout, stderr) = (read_all(child.stdout.take()), read_all(child.stderr.take()));
    let stderr = || {
        let bytes = stderr.recv_timeout(left().max(Duration::from_millis(100)));
        let text = String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned();
        let lines: Vec<&str> = text.trim_end().lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    };
    let timed_out = |child: &mut Child| {
        let _ = child.kill();
        let _ = child.wait();
        RewardError::Timeout(name(), timeout, stderr())
    };
    let failed = |status| RewardError::Failed(name(), status, stderr());

    // Its stdout closes when it exits; its status follows.
    let output = match stdout.recv_timeout(left()) {
        Ok(bytes) => bytes,
        Err(RecvTimeoutError::Disconnected) => Vec::new(),
        Err(RecvTimeoutError::Timeout) => return Err(timed_out(&mut child)),
    };
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => return Err(failed(status.to_string())),
            Ok(None) if left().is_zero() => return Err(timed_out(&mut child)),
            Ok(None) => thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(failed(format!("cannot wait for it: {e}"))),
        }
    }

    let text = String::from_utf8_lossy(&output);
    let lines: Vec<&str> = text.trim_end().lines().collect();
    if lines.len() != items.len() {
        let (expected, got) = (items.len(), lines.len());
        return Err(RewardError::LineCount(name(), expected, got, stderr()));
    }
    let number = |(i, line): (usize, &&str)| match line.trim().parse::<f64>() {
        Ok(value) if value.is_finite() => Ok(value),
        _ => Err(RewardError::BadLine(name(), i + 1, line.to_string())),
    };
    lines.iter().enumerate().map(number).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Held while a test writes a script or starts a program: a script being written while
    /// another thread forks can be refused (ETXTBSY).
    static SPAWN: Mutex<()> = Mutex::new(());

    fn score(program: &str, secs: u64, items: &[Scored<'_>]) -> Result<Vec<f64>, RewardError> {
        let (program, args, timeout) = (program.into(), Vec::new(), Duration::from_secs(secs));
        let reward = Reward::Command {
            program,
            args,
            timeout,
        };
        let _spawn = SPAWN.lock().unwrap_or_else(|e| e.into_inner());
        reward.score(items)
    }

    fn item<'a>(completion: &'a str, answer: &'a str) -> Scored<'a> {
        let prompt = "What is 3 - 10?";
        Scored {
            prompt,
            completion,
            answer,
        }
    }

    /// Three items, one with a newline and quotes.
    fn three() -> [Scored<'static>; 3] {
        [item("b", "c"), item("e\n\"f\"", "g"), item("i", "j")]
    }

    /// Checks exact_match with GSM8K's pattern on one completion and answer.
    fn check(completion: &str, answer: &str, expected: f64) {
        let pattern = Regex::new(Reward::GSM8K_PATTERN).unwrap();
        let got = Reward::ExactMatch { pattern }.score(&[item(completion, answer)]);
        assert_eq!(got.unwrap(), [expected], "{completion:?} for {answer:?}");
    }

    /// Runs `body` as an executable `#!/bin/sh` script on [`three`]: its path and the result.
    fn script(body: &str, timeout_secs: u64) -> (String, Result<Vec<f64>, RewardError>) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let spawn = SPAWN.lock().unwrap_or_else(|e| e.into_inner());
        let path = dir.path().join("reward.sh");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let program = path.to_string_lossy().into_owned();
        drop(spawn);
        let result = score(&program, timeout_secs, &three());
        (program, result)
    }

    fn says(err: RewardError, parts: &[&str]) {
        let err = err.to_string();
        assert!(parts.iter().all(|part| err.contains(part)), "{err}");
    }

    #[test]
    fn exact_match_gsm8k_text() {
        let completion = "48/2 = 24 clips, 48+24 = 72 in all.\n#### 72";
        check(completion, "#### 72", 1.0);
        check("#### 5, no:\n#### 72", "72", 1.0);
        check(&completion.replace("72", "71"), "72", 0.0);
    }

    #[test]
    fn exact_match_plain_last_number_or_none() {
        check("48 + 24 = 72. So 72.", "72", 1.0);
        check("It is 72, not 48", "72", 0.0);
        check("72.0", "72", 1.0);
        check("I do not know.", "72", 0.0);
        check("", "72", 0.0);
    }

    #[test]
    fn exact_match_negative_numbers_and_commas() {
        check("-7", "-7", 1.0);
        check("3 - 10 = -7", "-7", 1.0);
        check("7", "-7", 0.0);
        check("It costs $1,000.", "1000", 1.0);
        check("#### 1,000", "1000.00", 1.0);
        check("#### 1,001", "1000", 0.0);
    }

    #[test]
    fn exact_match_reference_in_gsm8k_form() {
        let answer = "Janet sells 16 - 3 - 4 = 9 eggs.\n9 * 2 = 18\n#### 18";
        check("So 18", answer, 1.0);
        check("So 9", answer, 0.0);
        let pattern = Regex::new(Reward::GSM8K_PATTERN).unwrap();
        assert_eq!(extract_answer(answer, &pattern).as_deref(), Some("18"));
        assert_eq!(extract_answer("none", &pattern), None);
    }

    #[test]
    fn regex_matches_anywhere() {
        let pattern = Regex::new(r"(?s)<think>.*</think>").unwrap();
        let items = [item("<think>\nhm\n</think> 4", ""), item("4", "")];
        let reward = Reward::Regex { pattern };
        assert_eq!(reward.score(&items).unwrap(), [1.0, 0.0]);
        assert_eq!(reward.kind(), "regex");
    }

    #[test]
    fn command_scores_every_line() {
        let (_, result) = script("while read -r l; do echo ' 0.5 '; done", 10);
        assert_eq!(result.unwrap(), [0.5; 3]);
    }

    #[test]
    fn command_passes_large_json_lines_without_deadlock() {
        // `cat` echoes its input (6 MB): its first line is the first item's JSON line.
        let long = "x".repeat(100_000);
        let mut items = Vec::from(three());
        items.extend((0..60).map(|_| item(&long, "")));
        let result = score("cat", 30, &items);
        let Err(RewardError::BadLine(_, 1, text)) = result else {
            panic!("{result:?}")
        };
        assert_eq!(format!("{text}\n"), json_line(&items[0]));
        let json: serde_json::Value = serde_json::from_str(&json_line(&items[1])).unwrap();
        assert_eq!(json["completion"], "e\n\"f\"");
    }

    #[test]
    fn command_wrong_line_count_is_an_error() {
        let (program, result) = script("cat > /dev/null; echo 1", 10);
        says(result.unwrap_err(), &[&program, "1 lines for 3"]);
    }

    #[test]
    fn command_not_a_number_is_an_error() {
        let (program, result) = script("cat > /dev/null; echo abc; echo 1; echo 1", 10);
        says(result.unwrap_err(), &[&program, "line 1", "\"abc\""]);
        let (_, result) = script("cat > /dev/null; echo 1; echo nan; echo 1", 10);
        says(result.unwrap_err(), &["line 2", "nan"]);
    }

    #[test]
    fn command_exit_status_is_an_error() {
        let (program, result) = script("echo 1; echo oops >&2; exit 3", 10);
        says(result.unwrap_err(), &[&program, "exit status: 3", "oops"]);
    }

    #[test]
    fn command_timeout_kills_it() {
        let start = Instant::now();
        let (program, result) = script("sleep 5", 1);
        let elapsed = start.elapsed();
        assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
        says(result.unwrap_err(), &[&program, "timeout of 1 s", "killed"]);
    }

    #[test]
    fn command_missing_program_is_an_error() {
        let result = score("/no/such/reward", 1, &three());
        says(result.unwrap_err(), &["/no/such/reward", "cannot start it"]);
    }
}

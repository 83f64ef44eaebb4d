//! Backends that read a vendor's management tool instead of a library:
//! AMD (`amd-smi`, falling back to `rocm-smi`), Huawei Ascend (`npu-smi`),
//! Cambricon (`cnmon`) and Iluvatar (`ixsmi`). Each runs its tool through a
//! [`Tool`], so the parsers are tested against outputs recorded in the
//! repository (`supplier-agent/tests/fixtures/`, with a README saying where
//! each came from) and the real tool is only a `Command` away.
//!
//! The device order is the tool's: the agent registers the GPUs in it, so
//! the exchange's `index_on_host` is the vendor's device index, from which
//! the delivery backend names the device nodes a container gets
//! (`GpuDevices`).

pub mod amd;
pub mod ascend;
pub mod cambricon;
pub mod iluvatar;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use crate::backend::BackendError;

/// Runs a vendor tool and returns its standard output.
pub trait Tool: Send {
    fn run(&mut self, program: &str, args: &[&str]) -> Result<String, BackendError>;
}

/// The host's own tools, found on `PATH`. A tool that does not answer
/// within `timeout` is killed and the query fails (a hung driver must not
/// stop the agent's sampling loop).
pub struct SystemTool {
    pub timeout: Duration,
}

impl Default for SystemTool {
    fn default() -> Self {
        SystemTool { timeout: Duration::from_secs(20) }
    }
}

impl Tool for SystemTool {
    fn run(&mut self, program: &str, args: &[&str]) -> Result<String, BackendError> {
        let what = command_line(program, args);
        let mut child = Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|error| match error.kind() {
                std::io::ErrorKind::NotFound => BackendError::Unavailable(format!("{program} is not installed (not on PATH)")),
                _ => BackendError::Query { what: what.clone(), detail: error.to_string() },
            })?;
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(BackendError::Query { what, detail: format!("no answer within {:?}", self.timeout) });
                }
                Err(error) => return Err(BackendError::Query { what, detail: error.to_string() }),
            }
        }
        let output = child.wait_with_output().map_err(|e| BackendError::Query { what: what.clone(), detail: e.to_string() })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(BackendError::Query { what, detail: format!("{}: {}", output.status, stderr.trim()) });
        }
        String::from_utf8(output.stdout).map_err(|_| BackendError::Query { what, detail: "output is not UTF-8".into() })
    }
}

/// Outputs recorded in advance, keyed by the command line (`program arg
/// arg`); a command not recorded fails as a missing tool would. For tests.
#[derive(Default)]
pub struct RecordedTool {
    pub outputs: BTreeMap<String, Result<String, BackendError>>,
}

impl RecordedTool {
    pub fn with(mut self, command: &str, output: &str) -> Self {
        self.outputs.insert(command.to_string(), Ok(output.to_string()));
        self
    }

    pub fn failing(mut self, command: &str, error: BackendError) -> Self {
        self.outputs.insert(command.to_string(), Err(error));
        self
    }
}

impl Tool for RecordedTool {
    fn run(&mut self, program: &str, args: &[&str]) -> Result<String, BackendError> {
        let line = command_line(program, args);
        match self.outputs.get(&line) {
            Some(output) => output.clone(),
            None if self.outputs.keys().any(|k| k.split(' ').next() == Some(program)) => {
                Err(BackendError::Query { what: line, detail: "exit status: 2: unknown option".into() })
            }
            None => Err(BackendError::Unavailable(format!("{program} is not installed (not on PATH)"))),
        }
    }
}

fn command_line(program: &str, args: &[&str]) -> String {
    std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ")
}

/// A query's output could not be read: which tool, and why.
fn unreadable(what: &str, detail: impl std::fmt::Display) -> BackendError {
    BackendError::Query { what: what.to_string(), detail: detail.to_string() }
}

/// A number in a vendor tool's text: `"43.0"`, `"43 C"`, `"139 W"`,
/// `"[N/A]"` (none). Fractions are cut.
fn leading_number(text: &str) -> Option<f64> {
    let text = text.trim();
    let end = text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-')).unwrap_or(text.len());
    text[..end].parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Picks the named backend: `nvml` (the default), `amd`, `ascend`,
/// `cambricon` or `iluvatar`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    #[default]
    Nvml,
    Amd,
    Ascend,
    Cambricon,
    Iluvatar,
}

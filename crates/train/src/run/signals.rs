//! SIGTERM and SIGINT end a training run cleanly: the step in progress finishes, a checkpoint is
//! written at it (as the dashboard's stop key does), the dashboard gives the terminal back, and
//! `train` exits with `128 + signal` (143 for SIGTERM, 130 for SIGINT). A second signal while
//! the first is being handled ends the process at once with the same code.
//!
//! The handlers are the run's: installed when it starts and removed when it ends, so two runs
//! in one process do not share them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use signal_hook::SigId;
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::error::{Result, TrainError};

/// The stop signals of one run.
#[derive(Debug)]
pub struct StopSignals {
    received: Arc<AtomicUsize>,
    ids: Vec<SigId>,
}

impl StopSignals {
    /// Install the handlers for SIGTERM and SIGINT.
    pub fn install() -> Result<Self> {
        let received = Arc::new(AtomicUsize::new(0));
        let pending = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        for signal in [SIGTERM, SIGINT] {
            let code = 128 + signal;
            let fail = |e: std::io::Error| {
                TrainError::Other(format!("installing the handler of signal {signal}: {e}"))
            };
            // Registered first, so it sees the flag as the previous signal left it: the second
            // signal exits at once.
            ids.push(
                signal_hook::flag::register_conditional_shutdown(
                    signal,
                    code,
                    Arc::clone(&pending),
                )
                .map_err(fail)?,
            );
            ids.push(signal_hook::flag::register(signal, Arc::clone(&pending)).map_err(fail)?);
            ids.push(
                signal_hook::flag::register_usize(signal, Arc::clone(&received), signal as usize)
                    .map_err(fail)?,
            );
        }
        Ok(Self { received, ids })
    }

    /// The signal received so far, if any.
    pub fn received(&self) -> Option<i32> {
        match self.received.load(Ordering::Relaxed) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// A signal's name for messages.
pub fn name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        _ => "a signal",
    }
}

//! A GPU device's first use, checked: cubecl acquires the wgpu adapter lazily, on a runner
//! thread that panics when there is none ("no adapter found"), and the caller then panics on a
//! closed channel. One tiny operation on the device, once per process, turns that into an error
//! that says what was missing.

use std::sync::{Mutex, OnceLock};

use burn::tensor::{Device, Tensor};

/// The first use of `device` (`name` as the user wrote it): `Err` with the runtime's own message
/// when it cannot start. Checked once per process and name; later calls return the first answer.
pub(crate) fn probe(name: &str, device: &Device) -> std::result::Result<(), String> {
    static DONE: OnceLock<Mutex<Vec<(String, std::result::Result<(), String>)>>> = OnceLock::new();
    let done = DONE.get_or_init(|| Mutex::new(Vec::new()));
    let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, answer)) = done.iter().find(|(n, _)| n == name) {
        return answer.clone();
    }
    // The runtime's message comes from its runner thread's panic: keep the first one, print none.
    let message: &'static Mutex<Option<String>> = Box::leak(Box::new(Mutex::new(None)));
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()));
        let mut slot = message.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = text;
        }
    }));
    let ran = std::panic::catch_unwind(|| Tensor::<1>::zeros([1], device).into_data());
    std::panic::set_hook(previous);
    let answer = ran.map(|_| ()).map_err(|_| {
        message
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "the device's runtime failed to start".into())
    });
    done.push((name.to_string(), answer.clone()));
    answer
}

//! A wgpu device without any driver is a clear error from `device_from_name`, not a panic on
//! first use (cubecl acquires the adapter lazily, on a runner thread that panics).
//! Its own test binary: the driver-hiding variables must be set before anything starts wgpu.

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_without_a_driver_is_an_error_not_a_panic() {
    // SAFETY: this binary's only test; nothing else reads the environment concurrently.
    unsafe {
        // Vulkan loader >= 1.3.234: hide every ICD (lavapipe included); EGL: no vendor library.
        std::env::set_var("VK_LOADER_DRIVERS_DISABLE", "*");
        std::env::set_var(
            "__EGL_VENDOR_LIBRARY_FILENAMES",
            "/nonexistent/egl_vendor.json",
        );
    }
    let first = qwen_burn_model::device::device_from_name("wgpu")
        .expect_err("no driver, yet wgpu started")
        .to_string();
    assert!(first.contains("device `wgpu` cannot start"), "{first}");
    assert!(
        first.contains("adapter"),
        "the runtime's own reason is kept: {first}"
    );
    let again = qwen_burn_model::device::device_from_name("wgpu")
        .expect_err("the second call must give the first answer")
        .to_string();
    assert_eq!(first, again);
}

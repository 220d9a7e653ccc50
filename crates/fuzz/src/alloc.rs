//! The counting allocator and the allocation bound of one parser.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;

use proptest::test_runner::TestCaseError;
/// Requests above this many bytes are refused outright: no input of a few KiB may ask for it.
pub const HARD_LIMIT: usize = 4 << 30;

/// Counts the bytes each thread holds and their peak (see the module docs).
pub struct Counting;

thread_local! {
    static CURRENT: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// The input being measured, written to stderr when a request is refused.
    static INPUT: Cell<(*const u8, usize)> = const { Cell::new((std::ptr::null(), 0)) };
}

fn grow(bytes: usize) {
    let _ = CURRENT.try_with(|c| {
        let now = c.get() + bytes as isize;
        c.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

fn shrink(bytes: usize) {
    let _ = CURRENT.try_with(|c| c.set(c.get() - bytes as isize));
}

/// Writes `n` in decimal without allocating.
fn write_usize(out: &mut impl Write, mut n: usize) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let _ = out.write_all(&buf[i..]);
}

/// Reports a refused request and the input that made it, without allocating.
fn report_refused(size: usize) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(b"\nfuzz allocator: refused a request of ");
    write_usize(&mut err, size);
    let _ = err.write_all(b" bytes while parsing this input (");
    let (ptr, len) = INPUT.try_with(Cell::get).unwrap_or((std::ptr::null(), 0));
    write_usize(&mut err, len);
    let _ = err.write_all(b" bytes, escaped):\n");
    if !ptr.is_null() {
        // SAFETY: `measure` sets the pointer from a slice that outlives the measured call and
        // clears it afterwards; this runs on the same thread, inside that call.
        let input = unsafe { std::slice::from_raw_parts(ptr, len) };
        let mut buf = [0u8; 512];
        let mut used = 0;
        for b in input.iter().flat_map(|b| b.escape_ascii()) {
            buf[used] = b;
            used += 1;
            if used == buf.len() {
                let _ = err.write_all(&buf);
                used = 0;
            }
        }
        let _ = err.write_all(&buf[..used]);
    }
    let _ = err.write_all(b"\n");
}

// SAFETY: every call is forwarded to `System`; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > HARD_LIMIT {
            report_refused(layout.size());
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > HARD_LIMIT {
            report_refused(layout.size());
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrink(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > HARD_LIMIT {
            report_refused(new_size);
            return std::ptr::null_mut();
        }
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            grow(new_size);
            shrink(layout.size());
        }
        p
    }
}

/// Runs `f` and returns its result with the peak bytes this thread held during it, above what
/// it held before. `input` is what `f` parses (reported if an allocation is refused).
pub fn measure<R>(input: &[u8], f: impl FnOnce() -> R) -> (R, usize) {
    let base = CURRENT.with(Cell::get);
    PEAK.with(|p| p.set(base));
    INPUT.with(|i| i.set((input.as_ptr(), input.len())));
    let out = f();
    INPUT.with(|i| i.set((std::ptr::null(), 0)));
    let peak = PEAK.with(Cell::get);
    (out, (peak - base).max(0) as usize)
}

/// `peak <= per_byte * input_len + base`: the allocation bound of one parser.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    /// Bytes allowed per input byte (A).
    pub per_byte: usize,
    /// Bytes allowed whatever the input (B).
    pub base: usize,
}

/// 1 MiB.
pub const MIB: usize = 1 << 20;

impl Bound {
    /// Fails the case when `peak` is over the bound.
    pub fn check(&self, what: &str, input_len: usize, peak: usize) -> Result<(), TestCaseError> {
        let limit = self.per_byte * input_len + self.base;
        if peak > limit {
            return Err(TestCaseError::fail(format!(
                "{what}: parsing {input_len} bytes held {peak} bytes at its peak, over the bound \
                 {} * {input_len} + {} = {limit}",
                self.per_byte, self.base
            )));
        }
        Ok(())
    }
}

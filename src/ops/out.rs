//! Standard output for the CLI. `outln!` panics when the reader has gone
//! (`tollgate policy get … | head -3`); these writes stop instead, remember
//! why, and the command ends as it would have, without the panic: a reader
//! that left is the usual end of a pipeline, not a failure, while any other
//! write error (a full disk) is one and is reported.

use std::fmt;
use std::io::{self, Write};
use std::sync::Mutex;

/// The first write error, if any; once set, nothing more is written. A
/// process has one stdout, so one slot for the whole process.
static BROKEN: Mutex<Option<io::ErrorKind>> = Mutex::new(None);

/// Writes `args` to stdout unless an earlier write failed; the backend of
/// the `out!` and `outln!` macros.
pub fn write(args: fmt::Arguments<'_>) {
    write_bytes(|out| out.write_fmt(args));
}

/// Writes `bytes` (generated text, such as a completion script) to stdout
/// as [`write()`] does.
pub fn write_all(bytes: &[u8]) {
    write_bytes(|out| out.write_all(bytes));
}

fn write_bytes(f: impl FnOnce(&mut io::StdoutLock<'static>) -> io::Result<()>) {
    let mut broken = BROKEN.lock().unwrap_or_else(|e| e.into_inner());
    if broken.is_some() {
        return;
    }
    if let Err(err) = f(&mut io::stdout().lock()) {
        *broken = Some(err.kind());
    }
}

/// Flushes stdout and says how the output ended: `Ok` when it was all
/// written or its reader went away, the error otherwise.
pub fn finish() -> Result<(), io::ErrorKind> {
    write_bytes(|out| out.flush());
    match *BROKEN.lock().unwrap_or_else(|e| e.into_inner()) {
        None | Some(io::ErrorKind::BrokenPipe) => Ok(()),
        Some(kind) => Err(kind),
    }
}

/// Whether `err` is, or was caused by, a write to a reader that went away.
pub fn is_broken_pipe(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if err
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        cause = err.source();
    }
    false
}

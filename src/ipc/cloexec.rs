//! Close-on-exec for the GPU driver's descriptors of this process.
//!
//! The exporter of a lent buffer takes the receiver's end (its pid exiting) for the end
//! of every use of the buffer: the driver tears a process's contexts down when the last
//! descriptor of its `/dev/nvidia*` files closes. A descriptor that a program the
//! receiver started inherits would keep those contexts (and the work in them) alive
//! after the receiver ended. The driver opens most of its descriptors close-on-exec, but
//! not all (`/dev/nvidiactl`), so gpubind sets the flag on every one of them before it
//! maps memory of another process, and when it creates a pool others may import (whose
//! exported descriptor the driver also creates inheritable).

/// Sets `FD_CLOEXEC` on each open descriptor of this process whose file is one of the
/// GPU driver's (`/dev/nvidia*`), as `/proc/self/fd` lists them. Best effort: a
/// descriptor that cannot be marked is logged, as is a `/proc` that cannot be read.
pub(crate) fn mark_driver_descriptors() {
    let entries = match std::fs::read_dir("/proc/self/fd") {
        Ok(entries) => entries,
        Err(e) => {
            log::warn!(
                "gpubind: cannot list /proc/self/fd to mark the driver's descriptors close-on-exec: {e}"
            );
            return;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(fd) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue; // closed meanwhile (read_dir's own descriptor among them)
        };
        if !target
            .as_os_str()
            .as_encoded_bytes()
            .starts_with(b"/dev/nvidia")
        {
            continue;
        }
        if let Err(e) = set_cloexec(fd) {
            log::warn!(
                "gpubind: cannot mark {} (descriptor {fd}) close-on-exec: {e}",
                target.display()
            );
        }
    }
}

/// Sets `FD_CLOEXEC` on descriptor `fd`, unless it is set already.
pub(super) fn set_cloexec(fd: i32) -> std::io::Result<()> {
    // SAFETY: `fcntl` with `F_GETFD` reads only the flags of descriptor `fd` (an integer,
    // no memory is passed); a descriptor closed since it was listed fails with `EBADF`.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if flags & libc::FD_CLOEXEC != 0 {
        return Ok(());
    }
    // SAFETY: `F_SETFD` changes only the close-on-exec flag of descriptor `fd`. If it was
    // closed and its number reused since it was listed, that descriptor becomes
    // close-on-exec: it is then not inherited by programs this process executes, which
    // redirect their standard streams with `dup2` (that clears the flag on the copy).
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn set_cloexec_marks_a_descriptor() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let fd = file.as_raw_fd();
        // SAFETY: clears the flags of a descriptor this test owns.
        assert!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } >= 0);
        set_cloexec(fd).unwrap();
        // SAFETY: reads the flags of a descriptor this test owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        set_cloexec(fd).unwrap(); // already set: nothing to do
    }

    #[test]
    fn set_cloexec_of_a_bad_descriptor_is_an_error() {
        assert!(set_cloexec(-1).is_err());
    }
}

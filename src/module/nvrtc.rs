//! NVRTC compilation: [`compile`], [`Output`], [`nvrtc_available`].

use crate::error::{Error, Result};
use std::ffi::CString;

/// What NVRTC should produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// PTX text (portable; JIT-compiled at load).
    Ptx,
    /// A cubin for the one architecture named in the options.
    Cubin,
}

/// Whether an NVRTC gpubind can use can be loaded (see [`nvrtc_info`](crate::nvrtc_info) for which one:
/// the driver's major version first, `GPUBIND_NVRTC_PATH` to override).
pub fn nvrtc_available() -> bool {
    crate::driver::libraries::nvrtc().is_ok()
}

/// Compiles CUDA C++ source with NVRTC. Needs no GPU, no context and no driver: only
/// `libnvrtc` (the one [`nvrtc_info`](crate::nvrtc_info) reports). Options are passed through (e.g.
/// `--gpu-architecture=sm_90`, `-DN=4`).
pub fn compile(src: &str, name: &str, options: &[String], output: Output) -> Result<Vec<u8>> {
    let nvrtc = crate::driver::libraries::nvrtc()?;
    let csrc =
        CString::new(src).map_err(|_| Error::InvalidArgument("source contains NUL".into()))?;
    let cname =
        CString::new(name).map_err(|_| Error::InvalidArgument("name contains NUL".into()))?;
    let copts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Error::InvalidArgument("an option contains NUL".into()))?;
    let opt_ptrs: Vec<*const std::ffi::c_char> = copts.iter().map(|o| o.as_ptr()).collect();
    let n_opts = i32::try_from(opt_ptrs.len())
        .map_err(|_| Error::InvalidArgument(format!("{} options", opt_ptrs.len())))?;

    let failed = |r: i32, log: String| Error::Compile {
        program: name.into(),
        status: crate::driver::libraries::nvrtc_status_name(r),
        log,
    };
    let mut prog: crate::driver::libraries::NvrtcProgram = std::ptr::null_mut();
    // SAFETY: NUL-terminated source and name, alive for the call; no headers.
    let r = unsafe {
        (nvrtc.create_program)(
            &mut prog,
            csrc.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != crate::driver::libraries::NVRTC_SUCCESS {
        return Err(failed(r, String::new()));
    }
    let result = (|| {
        // SAFETY: `prog` is a live program; the option pointers are alive for the call.
        let r = unsafe { (nvrtc.compile_program)(prog, n_opts, opt_ptrs.as_ptr()) };
        if r != crate::driver::libraries::NVRTC_SUCCESS {
            return Err(failed(r, program_log(nvrtc, prog)));
        }
        let (get_size, get) = match output {
            Output::Ptx => (nvrtc.get_ptx_size, nvrtc.get_ptx),
            Output::Cubin => (nvrtc.get_cubin_size, nvrtc.get_cubin),
        };
        let mut size = 0usize;
        // SAFETY: live, compiled program; writes one size_t.
        let mut r = unsafe { get_size(prog, &mut size) };
        let mut out = vec![0u8; size];
        if r == crate::driver::libraries::NVRTC_SUCCESS && size > 0 {
            // SAFETY: live, compiled program; the buffer has the size NVRTC reported.
            r = unsafe { get(prog, out.as_mut_ptr().cast()) };
        }
        if r != crate::driver::libraries::NVRTC_SUCCESS || out.is_empty() {
            return Err(failed(
                r,
                "no output (for a cubin, name one real architecture: --gpu-architecture=sm_XY)"
                    .into(),
            ));
        }
        if output == Output::Ptx {
            // Drop the trailing NUL NVRTC includes in the size.
            while out.last() == Some(&0) {
                out.pop();
            }
        }
        Ok(out)
    })();
    // SAFETY: destroys the program created above, once.
    unsafe { (nvrtc.destroy_program)(&mut prog) };
    result
}

fn program_log(
    nvrtc: &crate::driver::libraries::Nvrtc,
    prog: crate::driver::libraries::NvrtcProgram,
) -> String {
    let mut size = 0usize;
    // SAFETY: live program; writes one size_t.
    if unsafe { (nvrtc.get_log_size)(prog, &mut size) } != crate::driver::libraries::NVRTC_SUCCESS {
        return String::new();
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: live program; the buffer has (at least) the size NVRTC reported.
    if unsafe { (nvrtc.get_log)(prog, buf.as_mut_ptr().cast()) }
        != crate::driver::libraries::NVRTC_SUCCESS
    {
        return String::new();
    }
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .trim()
        .to_owned()
}

//! NVRTC compilation: [`compile`], [`compile_with`], [`Output`], [`nvrtc_available`].

use super::options::CompileOptions;
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

/// Whether an NVRTC gpubind can use can be loaded (see [`crate::driver::libraries`] for which one:
/// the driver's major version first, `GPUBIND_NVRTC_PATH` to override).
pub fn nvrtc_available() -> bool {
    crate::driver::libraries::nvrtc().is_ok()
}

/// Compiles CUDA C++ source with NVRTC. Needs no GPU, no context and no driver: only
/// `libnvrtc` (chosen as [`crate::driver::libraries`] describes). Options are passed through (e.g.
/// `--gpu-architecture=sm_90`, `-DN=4`); [`compile_with`] takes checked
/// [`CompileOptions`] and adds the toolkit's headers.
pub fn compile(src: &str, name: &str, options: &[String], output: Output) -> Result<Vec<u8>> {
    let nvrtc = crate::driver::libraries::nvrtc()?;
    run(nvrtc, src, name, options, output)?.map_err(|(status, log)| Error::Compile {
        program: name.into(),
        status,
        log,
    })
}

/// The `INFINITY` and `NAN` macros of `<math.h>`, which NVRTC lacks, put before the
/// source by [`compile_with`] (the `#line` keeps NVRTC's line numbers the source's).
/// `1.0f / 0.0f` is a constant expression, so they work in `__device__` initialisers.
const MATH_MACROS: &str = "#ifndef INFINITY\n#define INFINITY (1.0f / 0.0f)\n#endif\n\
                           #ifndef NAN\n#define NAN (0.0f / 0.0f)\n#endif\n";

/// Compiles CUDA C++ source with NVRTC and checked [`CompileOptions`] (see
/// [`crate::module::options`]): the options' flags, the toolkit's include directory, the
/// `INFINITY`/`NAN` macros. The architecture is the options' [`Arch`](super::Arch)
/// (NVRTC's default virtual one when not set, which gives PTX only). Needs no GPU.
///
/// ```no_run
/// use gpubind::module::{Arch, CompileOptions, Output, compile_with};
/// let opts = CompileOptions::new().arch(Arch::Compute(80)).define("SCALE", 2);
/// let ptx = compile_with(
///     r#"extern "C" __global__ void k(float* x) { x[0] *= SCALE; }"#,
///     "k.cu",
///     &opts,
///     Output::Ptx,
/// )?;
/// # Ok::<(), gpubind::Error>(())
/// ```
pub fn compile_with(
    src: &str,
    name: &str,
    options: &CompileOptions,
    output: Output,
) -> Result<Vec<u8>> {
    let mut flags = options.nvrtc_options()?;
    let nvrtc = crate::driver::libraries::nvrtc()?;
    let include = options
        .uses_toolkit_include()
        .then(super::options::cuda_include_dir)
        .flatten();
    if let Some(dir) = &include
        && let Some(dir) = dir.to_str()
    {
        flags.push(format!("--include-path={dir}"));
    }
    let line = name.replace(['\\', '"', '\n', '\r'], "_");
    let full = format!("{MATH_MACROS}#line 1 \"{line}\"\n{src}");
    run(nvrtc, &full, name, &flags, output)?.map_err(|(status, log)| {
        let log = explain_failure(nvrtc, options, include.is_some(), &status, log);
        Error::Compile {
            program: name.into(),
            status,
            log,
        }
    })
}

/// NVRTC's log of a failed [`compile_with`], with what gpubind knows on top: the extra
/// flag NVRTC refused, or where it looked for the toolkit's headers when the source
/// includes a file NVRTC cannot open.
fn explain_failure(
    nvrtc: &crate::driver::libraries::Nvrtc,
    options: &CompileOptions,
    have_include: bool,
    status: &str,
    log: String,
) -> String {
    if status == "NVRTC_ERROR_INVALID_OPTION" {
        let refused = refused_flag(nvrtc, options.extra_flags(), &log);
        return match refused {
            Some(flag) => format!("NVRTC refused the option `{flag}`\n{log}"),
            None => log,
        };
    }
    let missing =
        log.contains("could not open source file") || log.contains("cannot open source file");
    if !missing || have_include {
        return log;
    }
    let why = if options.uses_toolkit_include() {
        let looked: Vec<String> = super::options::include_candidates()
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        format!(
            "no CUDA toolkit include directory was found: gpubind looked for cuda_fp16.h in {}; \
             set CUDA_HOME to the toolkit (or add CompileOptions::include_path)",
            looked.join(", ")
        )
    } else {
        "the toolkit's include directory is off (CompileOptions::toolkit_include(false))".into()
    };
    format!("{log}\n{why}")
}

/// Which of the extra `flags` NVRTC refused: the one its log names, else the first that
/// NVRTC refuses alone (compiling an empty program).
fn refused_flag<'f>(
    nvrtc: &crate::driver::libraries::Nvrtc,
    flags: &'f [String],
    log: &str,
) -> Option<&'f str> {
    let named = flags
        .iter()
        .find(|f| log.contains(f.split('=').next().unwrap_or(f)));
    named
        .or_else(|| {
            flags.iter().find(|f| {
                matches!(
                    run(nvrtc, "", "probe.cu", std::slice::from_ref(*f), Output::Ptx),
                    Ok(Err((s, _))) if s == "NVRTC_ERROR_INVALID_OPTION"
                )
            })
        })
        .map(String::as_str)
}

/// What NVRTC said about a failed compile: its status name and log.
type Failure = (String, String);

/// One NVRTC compile: the output, or NVRTC's status name and log (inner `Err`);
/// [`Error::InvalidArgument`] for input NVRTC cannot be given (a NUL byte).
fn run(
    nvrtc: &crate::driver::libraries::Nvrtc,
    src: &str,
    name: &str,
    options: &[String],
    output: Output,
) -> Result<std::result::Result<Vec<u8>, Failure>> {
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
    let failed = |r: i32, log: String| (crate::driver::libraries::nvrtc_status_name(r), log);
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
        return Ok(Err(failed(r, String::new())));
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
    Ok(result)
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

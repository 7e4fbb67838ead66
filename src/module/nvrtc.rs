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

/// Whether an NVRTC gpubind can use can be loaded (see [`nvrtc_info`](crate::nvrtc_info)
/// for which one: the driver's major version first, `GPUBIND_NVRTC_PATH` to override).
pub fn nvrtc_available() -> bool {
    crate::driver::libraries::nvrtc().is_ok()
}

/// Compiles CUDA C++ source with NVRTC. Needs no GPU, no context and no driver: only
/// `libnvrtc` (the one [`nvrtc_info`](crate::nvrtc_info) reports). Options are passed through (e.g.
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

/// The `INFINITY` macro of `<math.h>`, which NVRTC lacks, put before a source that uses
/// it by [`compile_with`]. From C++11 on it names a `constexpr` float, so it is a
/// constant everywhere (`__device__` initialisers included); before, the division is
/// done where it is used.
const INFINITY_MACRO: &str = "\
#if !defined(INFINITY) && __cplusplus >= 201103L
static constexpr float __gpubind_infinity = 1.0f / 0.0f;
#define INFINITY __gpubind_infinity
#endif
#ifndef INFINITY
#define INFINITY (1.0f / 0.0f)
#endif
";

/// `NAN`, likewise.
const NAN_MACRO: &str = "\
#if !defined(NAN) && __cplusplus >= 201103L
static constexpr float __gpubind_nan = 0.0f / 0.0f;
#define NAN __gpubind_nan
#endif
#ifndef NAN
#define NAN (0.0f / 0.0f)
#endif
";

/// `src` with the math macros it uses and does not `#define` itself put before it, and
/// a `#line` that keeps NVRTC's line numbers and file name the source's.
fn with_math_macros(src: &str, name: &str) -> String {
    let mut full = String::new();
    for (macro_name, text) in [("INFINITY", INFINITY_MACRO), ("NAN", NAN_MACRO)] {
        if src.contains(macro_name) && !defines(src, macro_name) {
            full.push_str(text);
        }
    }
    if full.is_empty() {
        return src.to_owned();
    }
    let file = name.replace(['\\', '"', '\n', '\r'], "_");
    full.push_str(&format!("#line 1 \"{file}\"\n"));
    full.push_str(src);
    full
}

/// Whether `src` has a `#define` of `macro_name` (`define`, blanks, the name, then a
/// character that cannot continue it).
fn defines(src: &str, macro_name: &str) -> bool {
    src.match_indices("define").any(|(at, d)| {
        let rest = &src[at + d.len()..];
        let trimmed = rest.trim_start_matches([' ', '\t']);
        trimmed.len() < rest.len()
            && trimmed.starts_with(macro_name)
            && !trimmed[macro_name.len()..]
                .starts_with(|c: char| c == '_' || c.is_ascii_alphanumeric())
    })
}

/// Compiles CUDA C++ source with NVRTC and checked [`CompileOptions`] (see
/// [`CompileOptions`](crate::CompileOptions)): the options' flags, the toolkit's include
/// directory, the `INFINITY`/`NAN` macros. The architecture is the options'
/// [`Arch`](super::Arch) (NVRTC's default virtual one when not set, which gives PTX only).
/// Needs no GPU.
///
/// ```no_run
/// use gpubind::{Arch, CompileOptions, Output, compile_with};
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
    let full = with_math_macros(src, name);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn math_macros_go_before_sources_that_use_them_only() {
        assert_eq!(with_math_macros("int x;", "k.cu"), "int x;");
        let inf = with_math_macros("float y = INFINITY;", "a\"b.cu");
        assert!(inf.starts_with(INFINITY_MACRO), "{inf}");
        assert!(!inf.contains("NAN"), "{inf}");
        assert!(
            inf.ends_with("#line 1 \"a_b.cu\"\nfloat y = INFINITY;"),
            "{inf}"
        );
        let both = with_math_macros("float y = INFINITY, z = NAN;", "k.cu");
        assert!(
            both.contains(INFINITY_MACRO) && both.contains(NAN_MACRO),
            "{both}"
        );
        // A source's own definition is left alone.
        let own = "#define INFINITY 2.0f\nfloat y = INFINITY, z = NAN;";
        let out = with_math_macros(own, "k.cu");
        assert!(
            !out.contains(INFINITY_MACRO) && out.contains(NAN_MACRO),
            "{out}"
        );
        assert!(defines("#  define\tNAN (0.f/0.f)", "NAN"));
        assert!(!defines("#define NAN_BOX 1", "NAN"));
        assert!(!defines("#defineNAN 1", "NAN"));
    }
}

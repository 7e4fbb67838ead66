//! NVRTC without a GPU: which library gpubind loads, and compiling with it. Where no NVRTC
//! can be loaded, the same calls must fail with the typed error (never a panic).
//!
//! To exercise the loading on a machine with two toolkits (or the pip wheels
//! `nvidia-cuda-nvrtc-cu12` and `nvidia-cuda-nvrtc`): put both library directories on
//! `LD_LIBRARY_PATH`, run this test, then again with `GPUBIND_NVRTC_PATH` naming the older
//! `libnvrtc.so.12`.

use gpubind::{Output, compile, nvrtc_available, nvrtc_info, nvrtc_supported_archs};

const SRC: &str = r#"
struct P { float a; unsigned n; };
extern "C" __global__ void k(P p, float* y) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) y[i] *= p.a;
}"#;

#[test]
fn nvrtc_is_chosen_and_compiles_or_is_a_typed_error() {
    if !nvrtc_available() {
        assert_eq!(nvrtc_info().unwrap_err(), gpubind::Error::NoNvrtc);
        assert_eq!(
            compile(SRC, "k.cu", &[], Output::Ptx).unwrap_err(),
            gpubind::Error::NoNvrtc
        );
        println!("no NVRTC here: checked the typed error only");
        return;
    }
    let info = nvrtc_info().unwrap();
    println!("NVRTC: {info:?}");
    let (major, _) = info.version;
    assert!(major >= 11, "{info:?}");
    // The library reports the version its name promises (a versioned soname).
    if let Some(v) = info
        .name
        .rsplit(".so.")
        .next()
        .filter(|_| info.name.contains(".so."))
        && let Some(m) = v.split('.').next().and_then(|m| m.parse::<u32>().ok())
    {
        assert_eq!(m, major, "{info:?}");
    }
    if let Ok(want) = std::env::var("GPUBIND_NVRTC_PATH")
        && !want.is_empty()
    {
        assert_eq!(info.name, want, "the override was not taken");
    }
    // Never newer than the driver, where there is one.
    if let Some(d) = info.driver_major
        && std::env::var("GPUBIND_NVRTC_PATH").map_or(true, |p| p.is_empty())
    {
        assert!(major <= d, "{info:?}");
    }
    let archs = nvrtc_supported_archs().unwrap();
    println!("supported: {archs:?}");
    let newest = archs
        .as_ref()
        .and_then(|a| a.iter().copied().max())
        .unwrap_or(75);
    // PTX for a virtual architecture, and a cubin for a real one.
    let ptx = compile(
        SRC,
        "k.cu",
        &[format!("--gpu-architecture=compute_{newest}")],
        Output::Ptx,
    )
    .unwrap();
    let text = String::from_utf8(ptx).unwrap();
    assert!(text.contains(".entry k("), "{text}");
    assert!(text.contains(&format!(".target sm_{newest}")), "{text}");
    let cubin = compile(
        SRC,
        "k.cu",
        &[format!("--gpu-architecture=sm_{newest}")],
        Output::Cubin,
    )
    .unwrap();
    assert_eq!(&cubin[..4], b"\x7fELF");
    // A compile error carries NVRTC's status name and log.
    match compile("this is not C++", "bad.cu", &[], Output::Ptx) {
        Err(gpubind::Error::Compile {
            program,
            status,
            log,
        }) => {
            assert_eq!(program, "bad.cu");
            assert_eq!(status, "NVRTC_ERROR_COMPILATION");
            assert!(log.contains("bad.cu"), "{log}");
        }
        other => panic!("not a compile error: {other:?}"),
    }
}

mod options {
    use gpubind::Error;
    use gpubind::{
        Arch, CompileOptions, CppStandard, Output, compile_with, cuda_include_dir, nvrtc_available,
    };

    fn invalid(opts: &CompileOptions) -> String {
        match opts.nvrtc_options() {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("not InvalidArgument: {other:?}"),
        }
    }

    #[test]
    fn options_translate_to_nvrtc_flags_in_order() {
        assert!(
            CompileOptions::default()
                .nvrtc_options()
                .unwrap()
                .is_empty()
        );
        assert_eq!(CompileOptions::new(), CompileOptions::default());
        let dir = std::env::temp_dir();
        let opts = CompileOptions::new()
            .define("N", 4)
            .define("EMPTY", "")
            .define("SCALE", "2.5f")
            .include_path(&dir)
            .std(CppStandard::Cpp17)
            .fast_math(true)
            .line_info(true)
            .debug(true)
            .arch(Arch::Compute(80))
            .flag("--maxrregcount=64");
        assert_eq!(
            opts.nvrtc_options().unwrap(),
            [
                "-DN=4".to_owned(),
                "-DEMPTY=".into(),
                "-DSCALE=2.5f".into(),
                format!("--include-path={}", dir.display()),
                "--std=c++17".into(),
                "--use_fast_math".into(),
                "--generate-line-info".into(),
                "--device-debug".into(),
                "--gpu-architecture=compute_80".into(),
                "--maxrregcount=64".into(),
            ]
        );
        assert_eq!(
            CompileOptions::new()
                .arch(Arch::Sm(90))
                .nvrtc_options()
                .unwrap(),
            ["--gpu-architecture=sm_90"]
        );
        assert_eq!(
            CompileOptions::new()
                .std(CppStandard::Cpp20)
                .nvrtc_options()
                .unwrap(),
            ["--std=c++20"]
        );
        assert!(CompileOptions::new().uses_toolkit_include());
        assert!(
            !CompileOptions::new()
                .toolkit_include(false)
                .uses_toolkit_include()
        );
        assert_eq!(CompileOptions::new().target_arch(), None);
    }

    #[test]
    fn bad_options_are_invalid_argument_naming_them() {
        let m = invalid(&CompileOptions::new().define("N=4", 1));
        assert!(
            m.contains("\"N=4\"") && m.contains("not a C identifier"),
            "{m}"
        );
        let m = invalid(&CompileOptions::new().define("A\nB", 1));
        assert!(m.contains("A\\nB"), "{m}");
        for name in ["", "1N", "A B", "A-B", "A(x)"] {
            let m = invalid(&CompileOptions::new().define(name, 1));
            assert!(m.contains(&format!("{name:?}")), "{m}");
        }
        let m = invalid(&CompileOptions::new().define("N", "1\n#define X"));
        assert!(m.contains("`N`") && m.contains("line break"), "{m}");
        let m = invalid(&CompileOptions::new().include_path("/no/such/gpubind/dir"));
        assert!(
            m.contains("/no/such/gpubind/dir") && m.contains("does not exist"),
            "{m}"
        );
        let m = invalid(&CompileOptions::new().flag("use_fast_math"));
        assert!(m.contains("\"use_fast_math\""), "{m}");
        let m = invalid(&CompileOptions::new().flag("-O3\n-G"));
        assert!(m.contains("not an option"), "{m}");
        for f in ["--gpu-architecture=sm_90", "-arch=sm_80", "-arch"] {
            let m = invalid(&CompileOptions::new().flag(f));
            assert!(m.contains(f) && m.contains("CompileOptions::arch"), "{m}");
        }
        let m = invalid(&CompileOptions::new().arch(Arch::Sm(9)));
        assert!(m.contains("sm_9 "), "{m}");
        // Checked before NVRTC is looked for: the same error with or without one.
        let bad = CompileOptions::new().define("N=4", 1);
        assert!(matches!(
            compile_with("", "k.cu", &bad, Output::Ptx),
            Err(Error::InvalidArgument(m)) if m.contains("N=4")
        ));
    }

    /// Compiles `src` to PTX for compute_80, or says SKIPPED without NVRTC.
    fn ptx(src: &str, opts: CompileOptions) -> Option<Result<String, Error>> {
        if !nvrtc_available() {
            println!("SKIPPED: no NVRTC");
            return None;
        }
        let opts = opts.arch(Arch::Compute(80));
        Some(
            compile_with(src, "opts.cu", &opts, Output::Ptx)
                .map(|p| String::from_utf8(p).expect("PTX is text")),
        )
    }

    #[test]
    fn a_flag_nvrtc_refuses_is_a_compile_error_naming_it() {
        let src = r#"extern "C" __global__ void k(float* x) { x[0] = 1.0f; }"#;
        let Some(r) = ptx(src, CompileOptions::new().flag("--no-such-gpubind-flag")) else {
            return;
        };
        match r {
            Err(Error::Compile { status, log, .. }) => {
                assert_eq!(status, "NVRTC_ERROR_INVALID_OPTION");
                assert!(log.contains("`--no-such-gpubind-flag`"), "{log}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// Whether PTX holds `v` as a constant: a float literal (`0f7F800000`) or the
    /// integer a store of its bits is written as (`2139095040`).
    fn has_f32(ptx: &str, v: f32) -> bool {
        let bits = v.to_bits();
        ptx.contains(&format!("0f{bits:08X}"))
            || ptx
                .split(|c: char| !(c.is_ascii_digit() || c == '-'))
                .any(|t| t == (bits as i32).to_string() || t == bits.to_string())
    }

    #[test]
    fn infinity_nan_and_defines_compile() {
        let src = r#"
__device__ float lowest = -INFINITY;
extern "C" __global__ void k(float* x) {
    x[0] = INFINITY; x[1] = NAN; x[2] = VALUE; x[3] = lowest;
}"#;
        let Some(r) = ptx(src, CompileOptions::new().define("VALUE", "1.5f")) else {
            return;
        };
        let text = r.unwrap();
        assert!(has_f32(&text, f32::INFINITY), "{text}");
        assert!(has_f32(&text, f32::NEG_INFINITY), "{text}");
        assert!(has_f32(&text, 1.5), "{text}");
        // A source that defines them itself keeps its own.
        let own = "#ifndef INFINITY\n#define INFINITY 2.0f\n#endif\n".to_owned() + src;
        let text = ptx(&own, CompileOptions::new().define("VALUE", "1.5f"))
            .unwrap()
            .unwrap();
        assert!(
            has_f32(&text, 2.0) && !has_f32(&text, f32::INFINITY),
            "{text}"
        );
        // Without the define, NVRTC's log names the macro.
        match ptx(src, CompileOptions::new()).unwrap() {
            Err(Error::Compile { log, .. }) => assert!(log.contains("VALUE"), "{log}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn toolkit_headers_compile_or_say_where_gpubind_looked() {
        let src = r#"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void k(__half* h, __nv_bfloat16* b) {
    h[0] = __hadd(h[0], h[1]);
    b[0] = __float2bfloat16(__bfloat162float(b[0]) + 1.0f);
}"#;
        let Some(r) = ptx(src, CompileOptions::new()) else {
            return;
        };
        match cuda_include_dir() {
            Some(dir) => {
                println!("toolkit headers: {}", dir.display());
                let text = r.unwrap();
                assert!(text.contains(".entry k("), "{text}");
            }
            None => match r {
                Err(Error::Compile { log, .. }) => {
                    assert!(log.contains("cuda_fp16.h"), "{log}");
                    assert!(log.contains("gpubind looked for cuda_fp16.h in"), "{log}");
                    assert!(log.contains("/usr/local/cuda/include"), "{log}");
                }
                other => panic!("{other:?}"),
            },
        }
        // Turned off, the headers are not found (unless NVRTC has them built in).
        match ptx(src, CompileOptions::new().toolkit_include(false)).unwrap() {
            Err(Error::Compile { log, .. }) => {
                assert!(log.contains("toolkit_include(false)"), "{log}")
            }
            Ok(_) => println!("this NVRTC has the fp16/bf16 headers built in"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_sm_arch_gives_a_cubin_and_nul_bytes_are_invalid_arguments() {
        if !nvrtc_available() {
            println!("SKIPPED: no NVRTC");
            return;
        }
        let src = r#"extern "C" __global__ void k(float* x) { x[0] = SCALE; }"#;
        let opts = CompileOptions::new()
            .define("SCALE", "2.0f")
            .arch(Arch::Sm(80));
        let cubin = compile_with(src, "k.cu", &opts, Output::Cubin).unwrap();
        assert_eq!(&cubin[..4], b"\x7fELF");
        for (src, name) in [("a\0b", "k.cu"), ("", "k\0.cu")] {
            assert!(matches!(
                compile_with(src, name, &CompileOptions::new(), Output::Ptx),
                Err(Error::InvalidArgument(m)) if m.contains("NUL")
            ));
        }
    }
}

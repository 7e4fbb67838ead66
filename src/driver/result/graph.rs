//! Graphs: instantiation, launch, update, destruction.

use super::check;
use crate::error::Result;
use cudarc::driver::sys;

/// `cuGraphInstantiateWithFlags`: an executable graph of `graph` (the caller destroys it
/// with [`exec_destroy`]).
///
/// # Safety
///
/// `graph` is live and its context is current.
#[inline]
pub(crate) unsafe fn instantiate(graph: sys::CUgraph, flags: u64) -> Result<sys::CUgraphExec> {
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: the caller guarantees the graph; writes one handle.
    check(
        unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, flags) },
        "cuGraphInstantiateWithFlags",
    )?;
    Ok(exec)
}

/// `cuGraphLaunch`: enqueues `exec` on `stream`.
///
/// # Safety
///
/// `exec` and `stream` are live handles of the same context, and all memory the graph
/// uses stays valid until the launch has run.
#[inline]
pub(crate) unsafe fn launch(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's contract is this call's.
    check(unsafe { sys::cuGraphLaunch(exec, stream) }, "cuGraphLaunch")
}

/// `cuGraphUpload`: uploads `exec`'s work resources on `stream` without running it.
///
/// # Safety
///
/// `exec` and `stream` are live handles of the same context, and `exec` is not destroyed
/// before the upload has run.
#[inline]
pub(crate) unsafe fn upload(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's contract is this call's.
    check(unsafe { sys::cuGraphUpload(exec, stream) }, "cuGraphUpload")
}

/// `cuGraphExecGetFlags`: the flags `exec` was instantiated with.
///
/// # Safety
///
/// `exec` is live.
#[inline]
pub(crate) unsafe fn exec_flags(exec: sys::CUgraphExec) -> Result<u64> {
    let mut flags: sys::cuuint64_t = 0;
    // SAFETY: the caller guarantees the handle; writes one integer.
    check(
        unsafe { sys::cuGraphExecGetFlags(exec, &mut flags) },
        "cuGraphExecGetFlags",
    )?;
    Ok(flags)
}

/// `cuGraphGetNodes` with a null array: the number of nodes of `graph`.
///
/// # Safety
///
/// `graph` is live.
#[inline]
pub(crate) unsafe fn node_count(graph: sys::CUgraph) -> Result<usize> {
    let mut n = 0usize;
    // SAFETY: the caller guarantees the graph; a null array asks for the count only.
    check(
        unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) },
        "cuGraphGetNodes",
    )?;
    Ok(n)
}

/// `cuGraphExecUpdate_v2`: updates `exec` to `graph`'s parameters.
///
/// `Ok(Ok(()))` when updated; `Ok(Err(info))` when the driver refused the update
/// (`CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`, with its result info); `Err` for other
/// errors.
///
/// # Safety
///
/// `exec` and `graph` are live handles of the current context, and no launch of `exec`
/// runs concurrently with the call.
#[inline]
pub(crate) unsafe fn exec_update(
    exec: sys::CUgraphExec,
    graph: sys::CUgraph,
) -> Result<std::result::Result<(), sys::CUgraphExecUpdateResultInfo>> {
    // SAFETY: zero is a valid bit pattern of the plain-data result info.
    let mut info: sys::CUgraphExecUpdateResultInfo = unsafe { std::mem::zeroed() };
    // SAFETY: the caller guarantees the handles; writes the result info.
    match unsafe { sys::cuGraphExecUpdate_v2(exec, graph, &mut info) } {
        sys::CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => Ok(Err(info)),
        code => check(code, "cuGraphExecUpdate_v2").map(Ok),
    }
}

/// `cuGraphExecDestroy`.
///
/// # Safety
///
/// `exec` is live, destroyed once, and none of its launches still runs.
#[inline]
pub(crate) unsafe fn exec_destroy(exec: sys::CUgraphExec) -> Result<()> {
    // SAFETY: the caller owns the handle and nothing uses it any more.
    check(
        unsafe { sys::cuGraphExecDestroy(exec) },
        "cuGraphExecDestroy",
    )
}

/// `cuGraphDestroy`.
///
/// # Safety
///
/// `graph` is live, destroyed once, and not used after.
#[inline]
pub(crate) unsafe fn destroy(graph: sys::CUgraph) -> Result<()> {
    // SAFETY: the caller owns the handle and never uses it again.
    check(unsafe { sys::cuGraphDestroy(graph) }, "cuGraphDestroy")
}

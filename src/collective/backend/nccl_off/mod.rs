//! The NCCL backend in a build without gpubind's `nccl` feature: the crate-internal API
//! of `backend/nccl/`, with no NCCL code, types or library loading behind it.
//!
//! [`Backend::Nccl`](crate::collective::Backend::Nccl) stays in the API (a backend is often chosen at
//! run time, from a flag), and every way into it returns [`Error::FeatureDisabled`]
//! before anything is created. Its backends ([`NcclGroup`], [`NcclRank`]) are
//! uninhabited: they implement the backend traits, and their methods can never run.

use crate::collective::api::call::{Call, Plan};
use crate::collective::backend::interface::{
    GroupBackend, GroupLanes, RankBackend, RankCall, RankCapture, RankSeat,
};
use crate::collective::backend::kernels::engine::Shared;
use crate::collective::callcheck::CallCheck;
use crate::context::ThreadContext;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::graph::Capture;
use crate::stream::BoundStream;
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

fn disabled() -> Error {
    Error::FeatureDisabled {
        feature: "nccl",
        what: "the NCCL backend of the collectives (Backend::Nccl)",
    }
}

/// Always [`Error::FeatureDisabled`].
pub(crate) fn api() -> Result<()> {
    Err(disabled())
}

/// Always `false`: this build of gpubind has no NCCL backend (the `nccl` feature is off).
pub fn nccl_available() -> bool {
    false
}

/// Always [`Error::FeatureDisabled`]: this build of gpubind has no NCCL backend (the
/// `nccl` feature is off).
pub fn nccl_version() -> Result<(u32, u32, u32)> {
    Err(disabled())
}

/// Never made (uninhabited). `Send` and not `Sync`, like the real one, so
/// `Communicator` has the same auto traits in every build.
pub(crate) struct NcclGroup {
    never: Never,
    _not_sync: PhantomData<Cell<()>>,
}

/// Never made (uninhabited). `Send` and not `Sync`, like the real one, so `RankComm`
/// has the same auto traits in every build.
pub(crate) struct NcclRank {
    never: Never,
    _not_sync: PhantomData<Cell<()>>,
}

enum Never {}

impl NcclGroup {
    /// Always [`Error::FeatureDisabled`].
    pub(crate) fn init_all(_ordinals: &[usize]) -> Result<NcclGroup> {
        Err(disabled())
    }
}

impl NcclRank {
    /// Always [`Error::FeatureDisabled`].
    pub(crate) fn lazy_all(_devices: &[Arc<Device>], _timeout: Duration) -> Result<Vec<NcclRank>> {
        Err(disabled())
    }

    /// Always [`Error::FeatureDisabled`].
    pub(crate) fn init_process(
        _ctx: &mut ThreadContext,
        _device: &Arc<Device>,
        _ranks: (usize, usize),
        _id: &[u8; 128],
        _timeout: Duration,
        _check: Option<CallCheck>,
    ) -> Result<NcclRank> {
        Err(disabled())
    }
}

impl GroupBackend for NcclGroup {
    fn enqueue(
        &self,
        _ctx: &mut ThreadContext,
        _lanes: &GroupLanes<'_>,
        _calls: &[Call],
        _plan: &Plan,
    ) -> Result<()> {
        match self.never {}
    }

    fn capturable_engine(&self) -> Result<&Shared> {
        match self.never {}
    }
}

impl RankBackend for NcclRank {
    fn call(
        &mut self,
        _me: RankSeat<'_>,
        _stream: &BoundStream<'_>,
        _call: RankCall<'_>,
    ) -> Result<()> {
        match self.never {}
    }

    fn capture<'c, 'buf>(
        &'buf self,
        _capture: &mut Capture<'c, 'buf>,
        _me: RankSeat<'buf>,
        _call: RankCapture<'buf>,
    ) -> Result<()> {
        match self.never {}
    }
}

/// Always [`Error::FeatureDisabled`].
pub(crate) fn unique_id_bytes() -> Result<[u8; 128]> {
    Err(disabled())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_is_a_typed_error_without_the_feature() {
        assert!(!nccl_available());
        let e = nccl_version().unwrap_err();
        assert!(
            matches!(
                e,
                Error::FeatureDisabled {
                    feature: "nccl",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("`nccl` feature"), "{e}");
        assert!(matches!(api(), Err(Error::FeatureDisabled { .. })));
        assert!(matches!(
            unique_id_bytes(),
            Err(Error::FeatureDisabled { .. })
        ));
        assert!(matches!(
            NcclGroup::init_all(&[0]),
            Err(Error::FeatureDisabled { .. })
        ));
    }
}

//! Unit tests of the error types and their messages.

use super::*;

#[test]
fn device_lacks_names_the_capability_and_the_way_out() {
    let e = Error::DeviceLacks {
        device: 3,
        capability: "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS",
        what: "a host reference into managed memory (as_slice/as_mut_slice)",
        hint: Some("copy with BoundDevice::dtoh / htod_copy instead"),
    };
    assert_eq!(
        e.to_string(),
        "device 3 lacks CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, which a host reference \
         into managed memory (as_slice/as_mut_slice) needs; copy with BoundDevice::dtoh / \
         htod_copy instead"
    );
    let bare = Error::DeviceLacks {
        device: 0,
        capability: "X",
        what: "Y",
        hint: None,
    };
    assert_eq!(bare.to_string(), "device 0 lacks X, which Y needs");
}

#[test]
fn no_peer_access_names_both_devices_and_the_way_out() {
    let e = Error::NoPeerAccess { device: 0, peer: 3 };
    assert_eq!(
        e.to_string(),
        "device 0 cannot access device 3's memory directly (cuDeviceCanAccessPeer reports \
         no peer path); copy through host memory instead"
    );
}

#[test]
fn stream_priority_names_the_range_and_its_order() {
    let e = Error::StreamPriority {
        device: 1,
        requested: -9,
        greatest: -5,
        least: 0,
    };
    assert_eq!(
        e.to_string(),
        "stream priority -9 is outside device 1's range -5..=0 (lower numbers are higher \
         priorities; 0 is the default)"
    );
}

#[test]
fn not_capturable_names_what_and_why() {
    let e = Error::NotCapturable {
        what: "an NCCL collective",
        reason: "a graph belongs to one device".into(),
    };
    let msg = e.to_string();
    assert!(msg.contains("an NCCL collective cannot be captured into a CUDA graph"));
    assert!(msg.contains("one device"));
}

#[test]
fn graph_update_names_the_reason_and_the_way_out() {
    let e = Error::GraphUpdate {
        reason: "the topology changed".into(),
    };
    assert_eq!(
        e.to_string(),
        "the executable graph cannot be updated in place: the topology changed; \
         instantiate the new graph instead"
    );
}

//! The vendor-tool backends against outputs recorded in `tests/fixtures/`
//! (where each came from: `tests/fixtures/README.md`): inventory, health,
//! partitions, the fallback tool, and what a missing or broken tool gives.

use gpux_engine::{EngineConfig, Interconnect, Vendor};
use gpux_supplier_agent::backend::{BackendError, GpuBackend};
use gpux_supplier_agent::vendor_tools::amd::AmdBackend;
use gpux_supplier_agent::vendor_tools::ascend::AscendBackend;
use gpux_supplier_agent::vendor_tools::cambricon::CambriconBackend;
use gpux_supplier_agent::vendor_tools::iluvatar::IluvatarBackend;
use gpux_supplier_agent::vendor_tools::RecordedTool;

macro_rules! fixture {
    ($path:literal) => {
        include_str!(concat!("fixtures/", $path))
    };
}

const IXSMI_QUERY: &str = "ixsmi --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,pci.bus_id,driver_version,ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits";
const IXSMI_APPS: &str = "ixsmi --query-compute-apps=gpu_uuid,pid --format=csv,noheader,nounits";
const ROCM_SMI: &str = "rocm-smi --showproductname --showuniqueid --showbus --showmeminfo vram --showtemp --showpower --showuse --json";

fn amd_tool() -> RecordedTool {
    RecordedTool::default()
        .with("amd-smi version --json", fixture!("amd/version.json"))
        .with("amd-smi list --json", fixture!("amd/list.json"))
        .with("amd-smi static --json", fixture!("amd/static.json"))
        .with("amd-smi metric --json", fixture!("amd/metric.json"))
        .with("amd-smi process --json", fixture!("amd/process.json"))
}

#[test]
fn amd_smi_lists_instinct_gpus_and_withdraws_one_with_uncorrected_ecc_errors() {
    let mut backend = AmdBackend::with_tool(Box::new(amd_tool())).expect("amd-smi answers");
    let inventory = backend.inventory().expect("inventory");
    assert_eq!(inventory.len(), 2);
    assert_eq!(inventory[0].uuid, "c1ff74a1-0000-1000-80a4-4e4a3e5ff1b5");
    assert_eq!(inventory[0].spec.vendor, Vendor::Amd);
    assert_eq!(inventory[0].spec.model, "AMD Instinct MI300X");
    assert_eq!(inventory[0].spec.memory_mib, 196_592);
    assert_eq!(inventory[0].spec.interconnect, Interconnect::InfinityFabric, "OAM modules are xGMI-linked");
    assert_eq!(inventory[0].spec.mig_profile, None, "SPX is the whole GPU");
    assert_eq!(inventory[0].pci_bus_id.as_deref(), Some("0000:0c:00.0"));
    assert_eq!(inventory[0].driver_version.as_deref(), Some("6.7.0"));
    // The demo listing's MI300X class takes it.
    let config = EngineConfig::demo();
    let class = config.classes.iter().find(|c| c.name == "MI300X-192G").expect("demo lists MI300X");
    assert!(class.requirement.is_met_by(&inventory[0].spec));

    let samples = backend.sample(0).expect("sample");
    assert!(samples[0].healthy);
    assert_eq!(samples[0].utilisation_percent, 87);
    assert_eq!(samples[0].memory_used_mib, 150_211);
    assert_eq!(samples[0].temperature_c, Some(71), "edge is N/A on MI300X: the hotspot reading is used");
    assert_eq!(samples[0].power_mw, Some(612_000));
    assert_eq!(samples[0].processes, 1);
    assert!(!samples[1].healthy, "2 uncorrectable ECC errors withdraw GPU 1");
    assert_eq!(samples[1].ecc_uncorrected, Some(2));
    assert_eq!(samples[1].processes, 0, "\"No running processes detected\" is no process");
}

#[test]
fn amd_smi_partitions_are_listed_as_devices_of_their_profile_in_the_rocm_6_4_shape() {
    let tool = RecordedTool::default()
        .with("amd-smi version --json", fixture!("amd/version.json"))
        .with("amd-smi list --json", fixture!("amd/cpx-list.json"))
        .with("amd-smi static --json", fixture!("amd/cpx-static.json"));
    let mut backend = AmdBackend::with_tool(Box::new(tool)).expect("amd-smi answers");
    let inventory = backend.inventory().expect("inventory");
    assert_eq!(inventory.len(), 2);
    assert!(inventory.iter().all(|gpu| gpu.spec.mig_profile.as_deref() == Some("cpx.nps1") && gpu.mig_enabled));
    assert_eq!(inventory[1].spec.memory_mib, 24_574);
    assert_ne!(inventory[0].uuid, inventory[1].uuid);
    // A partition is not the whole GPU the MI300X class sells.
    let config = EngineConfig::demo();
    assert!(config.classes.iter().all(|class| !class.requirement.is_met_by(&inventory[0].spec)));
}

#[test]
fn without_amd_smi_the_backend_falls_back_to_rocm_smi() {
    let tool = RecordedTool::default().with(ROCM_SMI, fixture!("amd/rocm-smi.json"));
    let mut backend = AmdBackend::with_tool(Box::new(tool)).expect("rocm-smi answers");
    let inventory = backend.inventory().expect("inventory");
    assert_eq!(inventory.len(), 2, "the system entry is not a card");
    assert_eq!(inventory[0].spec.model, "AMD Instinct MI210");
    assert_eq!(inventory[0].spec.memory_mib, 65_520);
    assert_eq!(inventory[0].uuid, "AMD-0x6d4f3a2b1c0e9f88");
    let samples = backend.sample(0).expect("sample");
    assert!(samples[0].healthy);
    assert_eq!((samples[0].temperature_c, samples[0].utilisation_percent, samples[0].power_mw), (Some(38), 12, Some(34_000)));
    assert!(!samples[1].healthy, "96 C at the edge is too hot");
}

#[test]
fn a_host_without_rocm_is_told_what_to_install_and_a_broken_answer_names_the_query() {
    match AmdBackend::with_tool(Box::new(RecordedTool::default())) {
        Err(BackendError::Unavailable(message)) => assert!(message.contains("install ROCm"), "{message}"),
        other => panic!("expected unavailable, got {:?}", other.err()),
    }
    let garbage = amd_tool().with("amd-smi metric --json", "Traceback (most recent call last):\n  amdsmi_init failed");
    let mut backend = AmdBackend::with_tool(Box::new(garbage)).expect("amd-smi answers");
    match backend.sample(0) {
        Err(BackendError::Query { what, detail }) => {
            assert_eq!(what, "amd-smi metric --json");
            assert!(detail.contains("not JSON"), "{detail}");
        }
        other => panic!("expected a query error, got {other:?}"),
    }
}

fn ascend_tool(info: &str) -> RecordedTool {
    RecordedTool::default()
        .with("npu-smi info", info)
        .with("npu-smi info -t board -i 0", fixture!("ascend/board-0.txt"))
        .with("npu-smi info -t topo", fixture!("ascend/topo.txt"))
}

#[test]
fn npu_smi_lists_ascend_910b_chips_with_hccs_and_withdraws_one_in_alarm() {
    let mut backend = AscendBackend::with_tool(Box::new(ascend_tool(fixture!("ascend/info.txt")))).expect("npu-smi answers");
    let inventory = backend.inventory().expect("inventory");
    assert_eq!(inventory.len(), 3);
    assert_eq!(inventory[0].uuid, "NPU-102406815869-0", "board serial and chip index");
    assert_eq!(inventory[1].uuid, "NPU-0000:C2:00.0", "no board answer: the bus id");
    assert_eq!(inventory[0].spec.vendor, Vendor::Huawei);
    assert_eq!(inventory[0].spec.model, "Ascend 910B3");
    assert_eq!(inventory[0].spec.memory_mib, 65_536, "HBM");
    assert_eq!(inventory[0].spec.interconnect, Interconnect::Hccs);
    assert_eq!(inventory[2].spec.interconnect, Interconnect::Pcie, "NPU 2 has no HCCS link in the topology");
    assert_eq!(inventory[0].driver_version.as_deref(), Some("23.0.rc3"));

    let samples = backend.sample(0).expect("sample");
    assert!(samples[0].healthy && samples[1].healthy);
    assert_eq!(samples[1].utilisation_percent, 96);
    assert_eq!(samples[1].memory_used_mib, 61_847);
    assert_eq!(samples[1].temperature_c, Some(57));
    assert_eq!(samples[1].power_mw, Some(349_200));
    assert_eq!((samples[0].processes, samples[1].processes), (0, 1));
    assert!(!samples[2].healthy, "health Alarm withdraws the chip");
    assert_eq!(samples[0].uuid, inventory[0].uuid, "samples name the chips as the inventory does");
}

#[test]
fn npu_smi_on_a_310p_card_reads_its_ddr_memory_and_a_missing_power_reading() {
    let mut backend = AscendBackend::with_tool(Box::new(ascend_tool(fixture!("ascend/info-310p.txt")))).expect("npu-smi answers");
    let inventory = backend.inventory().expect("inventory");
    assert_eq!(inventory.len(), 1);
    assert_eq!(inventory[0].spec.model, "Ascend 310P3");
    assert_eq!(inventory[0].spec.memory_mib, 44_280);
    let samples = backend.sample(0).expect("sample");
    assert!(samples[0].healthy);
    assert_eq!((samples[0].power_mw, samples[0].memory_used_mib), (None, 1_782));
}

#[test]
fn a_host_without_the_ascend_driver_is_told_so_and_a_table_without_npus_is_an_error() {
    match AscendBackend::with_tool(Box::new(RecordedTool::default())) {
        Err(BackendError::Unavailable(message)) => assert!(message.contains("Ascend NPU driver"), "{message}"),
        other => panic!("expected unavailable, got {:?}", other.err()),
    }
    let mut backend = AscendBackend::with_tool(Box::new(ascend_tool("dcmi module initialize failed. ret is -8005"))).expect("npu-smi runs");
    assert!(matches!(backend.inventory(), Err(BackendError::Query { what, .. }) if what == "npu-smi info"));
}

#[test]
fn cnmon_lists_mlu370_cards_with_mlu_link_and_withdraws_one_with_multiple_bit_errors() {
    let tool = RecordedTool::default().with("cnmon info", fixture!("cambricon/info.txt"));
    let mut backend = CambriconBackend::with_tool(Box::new(tool)).expect("cnmon answers");
    let inventory = backend.inventory().expect("inventory");
    assert_eq!(inventory.len(), 2);
    assert_eq!(inventory[0].uuid, "MLU-2F3D1A6E-5C44-0000-0000-000000000000");
    assert_eq!(inventory[0].spec.vendor, Vendor::Cambricon);
    assert_eq!(inventory[0].spec.model, "Cambricon MLU370-X8");
    assert_eq!(inventory[0].spec.memory_mib, 49_152);
    assert_eq!(inventory[0].spec.interconnect, Interconnect::MluLink);
    assert_eq!(inventory[1].spec.interconnect, Interconnect::Pcie, "its MLU-Link ports are disabled");
    assert_eq!(inventory[0].pci_bus_id.as_deref(), Some("0:4f:0.0"));
    assert_eq!(inventory[0].driver_version.as_deref(), Some("v4.20.18"));

    let samples = backend.sample(0).expect("sample");
    assert!(samples[0].healthy, "single-bit errors are corrected");
    assert_eq!(samples[0].ecc_uncorrected, Some(0));
    assert_eq!((samples[0].utilisation_percent, samples[0].memory_used_mib, samples[0].temperature_c), (73, 40_871, Some(51)));
    assert_eq!((samples[0].power_mw, samples[0].processes), (Some(212_000), 1));
    assert!(!samples[1].healthy);
    assert_eq!((samples[1].ecc_uncorrected, samples[1].processes), (Some(3), 0));
}

#[test]
fn cnmon_output_without_cards_is_an_error_and_a_missing_tool_says_what_to_install() {
    match CambriconBackend::with_tool(Box::new(RecordedTool::default())) {
        Err(BackendError::Unavailable(message)) => assert!(message.contains("Cambricon MLU driver"), "{message}"),
        other => panic!("expected unavailable, got {:?}", other.err()),
    }
    let tool = RecordedTool::default().with("cnmon info", "Error: cndevInit failed, driver not loaded\n");
    let mut backend = CambriconBackend::with_tool(Box::new(tool)).expect("cnmon runs");
    assert!(matches!(backend.inventory(), Err(BackendError::Query { what, .. }) if what == "cnmon info"));
}

#[test]
fn ixsmi_lists_bi_v100_gpus_counts_their_processes_and_withdraws_a_hot_one() {
    let tool = RecordedTool::default().with(IXSMI_QUERY, fixture!("iluvatar/query.csv")).with(IXSMI_APPS, fixture!("iluvatar/apps.csv"));
    let mut backend = IluvatarBackend::with_tool(Box::new(tool)).expect("ixsmi answers");
    let inventory = backend.inventory().expect("inventory");
    assert_eq!(inventory.len(), 2);
    assert_eq!(inventory[0].uuid, "GPU-2b4e8a31-5c6d-7e8f-9a0b-1c2d3e4f5a6b");
    assert_eq!(inventory[0].spec.vendor, Vendor::Iluvatar);
    assert_eq!(inventory[0].spec.model, "Iluvatar BI-V100");
    assert_eq!(inventory[0].spec.memory_mib, 32_768);
    assert_eq!(inventory[0].pci_bus_id.as_deref(), Some("00000000:1B:00.0"));
    let samples = backend.sample(0).expect("sample");
    assert!(samples[0].healthy);
    assert_eq!((samples[0].utilisation_percent, samples[0].memory_used_mib, samples[0].processes), (91, 28_412, 2));
    assert_eq!((samples[0].power_mw, samples[0].ecc_uncorrected), (Some(187_420), None));
    assert!(!samples[1].healthy, "94 C is too hot");
}

#[test]
fn a_truncated_ixsmi_row_is_an_error_that_names_the_row() {
    let tool = RecordedTool::default().with(IXSMI_QUERY, fixture!("iluvatar/query-bad.csv"));
    let mut backend = IluvatarBackend::with_tool(Box::new(tool)).expect("ixsmi answers");
    match backend.inventory() {
        Err(BackendError::Query { detail, .. }) => assert_eq!(detail, "row 1: 4 fields, expected 11"),
        other => panic!("expected a query error, got {other:?}"),
    }
}

//! Preset images (docs/jobs.md "Preset images"): per framework version and
//! vendor stack (CUDA, ROCm, CANN, ...), each pinned by digest, in a TOML
//! file the operator owns. A job's image is the entry for its framework
//! whose version its requirement pins (or the newest that meets a floor),
//! on a stack of a vendor the job may run on; what the job declares beyond
//! what the image provides is installed at start.

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::detect::{Framework, Requirement};
use crate::spec::VendorChoice;

/// Entries a catalogue holds at most.
pub const IMAGES_MAX: usize = 1_024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CatalogueError {
    #[error("the catalogue does not parse: {0}")]
    Toml(String),
    #[error("image {index}: reference {reference:?} is not pinned by digest (name@sha256:<64 hex digits>)")]
    NotPinned { index: usize, reference: String },
    #[error("image {index}: version {version:?} is not a version number such as 2.4")]
    Version { index: usize, version: String },
    #[error("more than {IMAGES_MAX} images")]
    TooMany,
}

/// One preset image.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Image {
    /// `None` (`framework = "none"` in the file): a framework-free image
    /// (plain Python, a CUDA base) for code that needs no framework.
    #[serde(deserialize_with = "framework_or_none")]
    pub framework: Option<Framework>,
    /// The framework's version in it (`2.4`, `2.4.1`); for a
    /// framework-free image, its base's (Python's `3.12`).
    pub version: String,
    /// The vendor stack it is built on (`cuda-12.4`, `rocm-6.1`, `cann-8.0`).
    pub stack: String,
    pub vendor: gpux_engine::Vendor,
    /// Pinned: `registry/name@sha256:...`.
    pub reference: String,
    /// Distributions already installed in it (besides the framework).
    #[serde(default)]
    pub provides: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalogue {
    #[serde(default, rename = "image")]
    pub images: Vec<Image>,
}

/// The image chosen for a job, and what must be installed on top.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageChoice {
    pub image: Image,
    /// Why this one (`torch==2.1.0 pins 2.1`, `the newest for pytorch`).
    pub reason: String,
    /// Declared distributions the image does not provide (`pip install` at start).
    pub install: Vec<String>,
}

fn framework_or_none<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Framework>, D::Error> {
    let name = String::deserialize(deserializer)?;
    if name == "none" {
        return Ok(None);
    }
    let framework = Framework::ALL.into_iter().find(|f| f.name() == name);
    framework
        .map(Some)
        .ok_or_else(|| serde::de::Error::custom(format!("unknown framework {name:?}: pytorch, tensorflow, paddlepaddle, jax or none")))
}

fn version_parts(version: &str) -> Option<Vec<u32>> {
    let parts: Option<Vec<u32>> = version.split('.').map(|p| p.parse().ok()).collect();
    parts.filter(|p| !p.is_empty())
}

impl Catalogue {
    pub fn parse(text: &str) -> Result<Catalogue, CatalogueError> {
        let catalogue: Catalogue = toml::from_str(text).map_err(|e| CatalogueError::Toml(e.to_string()))?;
        if catalogue.images.len() > IMAGES_MAX {
            return Err(CatalogueError::TooMany);
        }
        for (index, image) in catalogue.images.iter().enumerate() {
            let digest = image.reference.rsplit_once("@sha256:").map(|(_, digest)| digest);
            if !digest.is_some_and(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit())) {
                return Err(CatalogueError::NotPinned { index, reference: image.reference.clone() });
            }
            if version_parts(&image.version).is_none() {
                return Err(CatalogueError::Version { index, version: image.version.clone() });
            }
        }
        Ok(catalogue)
    }

    /// The vendors with an image for `framework` the job may use.
    pub fn vendors_for(&self, framework: Framework, choice: VendorChoice) -> BTreeSet<gpux_engine::Vendor> {
        self.images.iter().filter(|i| i.framework == Some(framework) && choice.allows(i.vendor)).map(|i| i.vendor).collect()
    }

    /// The vendors with a framework-free image the job may use.
    pub fn plain_vendors(&self, choice: VendorChoice) -> BTreeSet<gpux_engine::Vendor> {
        self.images.iter().filter(|i| i.framework.is_none() && choice.allows(i.vendor)).map(|i| i.vendor).collect()
    }

    /// The newest framework-free image on `vendor`, for code that names no
    /// framework; every declared distribution it does not provide is
    /// installed at start.
    pub fn choose_plain(&self, vendor: gpux_engine::Vendor, declared: &[Requirement]) -> Option<ImageChoice> {
        let image = self.images.iter().filter(|i| i.framework.is_none() && i.vendor == vendor).max_by_key(|i| version_parts(&i.version))?;
        let provided: BTreeSet<String> = image.provides.iter().map(|p| normalise(p)).collect();
        let install =
            declared.iter().filter(|r| !provided.contains(&normalise(&r.name))).map(|r| format!("{}{}", r.name, r.version)).collect();
        let reason = format!("the newest framework-free image for {}", format!("{vendor:?}").to_lowercase());
        Some(ImageChoice { image: image.clone(), reason, install })
    }

    /// The image for `framework` on `vendor` that meets `requirement`: the
    /// pinned major.minor, or the newest at or above a floor, or the newest.
    pub fn choose(
        &self,
        framework: Framework,
        requirement: Option<&Requirement>,
        vendor: gpux_engine::Vendor,
        declared: &[Requirement],
    ) -> Option<ImageChoice> {
        let mut candidates: Vec<&Image> = self.images.iter().filter(|i| i.framework == Some(framework) && i.vendor == vendor).collect();
        // Newest first.
        candidates.sort_by_key(|image| std::cmp::Reverse(version_parts(&image.version)));
        let wanted = requirement.and_then(|r| r.version_number().and_then(version_parts).map(|v| (r, v)));
        let (image, reason) = match wanted {
            Some((requirement, version)) if requirement.pins() => {
                let prefix = &version[..version.len().min(2)];
                let image = candidates.into_iter().find(|i| version_parts(&i.version).is_some_and(|v| v.starts_with(prefix)))?;
                (image, format!("{}{} pins {}", requirement.name, requirement.version, join(prefix)))
            }
            Some((requirement, version)) => {
                let image = candidates.into_iter().find(|i| version_parts(&i.version).is_some_and(|v| v >= version))?;
                (image, format!("the newest meeting {}{}", requirement.name, requirement.version))
            }
            None => (candidates.into_iter().next()?, format!("the newest {} image", framework.name())),
        };
        let provided: BTreeSet<String> = image.provides.iter().map(|p| normalise(p)).collect();
        let install = declared
            .iter()
            .filter(|r| Framework::of_package(&r.name) != Some(framework) && !provided.contains(&normalise(&r.name)))
            .map(|r| format!("{}{}", r.name, r.version))
            .collect();
        Some(ImageChoice { image: image.clone(), reason, install })
    }
}

fn join(parts: &[u32]) -> String {
    parts.iter().map(u32::to_string).collect::<Vec<_>>().join(".")
}

fn normalise(name: &str) -> String {
    name.to_ascii_lowercase().replace('_', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "0000000000000000000000000000000000000000000000000000000000000001";

    fn catalogue() -> Catalogue {
        let text = format!(
            r#"
[[image]]
framework = "pytorch"
version = "2.1"
stack = "cuda-12.1"
vendor = "nvidia"
reference = "registry.example/pytorch@sha256:{DIGEST}"
provides = ["numpy"]

[[image]]
framework = "pytorch"
version = "2.4"
stack = "cuda-12.4"
vendor = "nvidia"
reference = "registry.example/pytorch@sha256:{DIGEST}"

[[image]]
framework = "pytorch"
version = "2.4"
stack = "rocm-6.1"
vendor = "amd"
reference = "registry.example/pytorch-rocm@sha256:{DIGEST}"

[[image]]
framework = "none"
version = "3.11"
stack = "cuda-12.4"
vendor = "nvidia"
reference = "registry.example/python-cuda@sha256:{DIGEST}"

[[image]]
framework = "none"
version = "3.12"
stack = "cuda-12.4"
vendor = "nvidia"
reference = "registry.example/python-cuda@sha256:{DIGEST}"
provides = ["numpy"]
"#
        );
        Catalogue::parse(&text).expect("parses")
    }

    fn requirement(name: &str, version: &str) -> Requirement {
        Requirement { name: name.into(), version: version.into(), source: "test".into() }
    }

    #[test]
    fn the_pinned_version_or_the_newest_over_a_floor_is_chosen_and_the_rest_installed() {
        let c = catalogue();
        let nvidia = gpux_engine::Vendor::Nvidia;
        let declared = vec![requirement("torch", "==2.1.0"), requirement("numpy", ""), requirement("einops", ">=0.7")];
        let pinned = c.choose(Framework::Pytorch, Some(&declared[0]), nvidia, &declared).expect("an image");
        assert_eq!((pinned.image.version.as_str(), pinned.install.clone()), ("2.1", vec!["einops>=0.7".to_string()]));
        let floor = requirement("torch", ">=2.2");
        assert_eq!(c.choose(Framework::Pytorch, Some(&floor), nvidia, &[]).expect("an image").image.version, "2.4");
        assert_eq!(c.choose(Framework::Pytorch, None, gpux_engine::Vendor::Amd, &[]).expect("an image").image.stack, "rocm-6.1");
        assert_eq!(c.choose(Framework::Pytorch, Some(&requirement("torch", "==1.13")), nvidia, &[]), None);
        assert_eq!(c.choose(Framework::Jax, None, nvidia, &[]), None);
        let vendors = c.vendors_for(Framework::Pytorch, VendorChoice::Any);
        assert_eq!(vendors.len(), 2);
        assert_eq!(c.vendors_for(Framework::Pytorch, VendorChoice::Amd).len(), 1);
    }

    #[test]
    fn code_without_a_framework_gets_the_newest_framework_free_image() {
        let c = catalogue();
        let declared = vec![requirement("numpy", ""), requirement("requests", ">=2")];
        let plain = c.choose_plain(gpux_engine::Vendor::Nvidia, &declared).expect("an image");
        assert_eq!((plain.image.version.as_str(), plain.install.clone()), ("3.12", vec!["requests>=2".to_string()]));
        assert_eq!(c.choose_plain(gpux_engine::Vendor::Amd, &declared), None);
        assert_eq!(c.plain_vendors(VendorChoice::Any).into_iter().collect::<Vec<_>>(), [gpux_engine::Vendor::Nvidia]);
        assert_eq!(c.vendors_for(Framework::Pytorch, VendorChoice::Any).len(), 2, "framework-free images serve no framework");
        let wrong = "[[image]]\nframework = \"torchx\"\nversion = \"1\"\nstack = \"cuda-12\"\nvendor = \"nvidia\"\nreference = \"x\"\n";
        assert!(matches!(Catalogue::parse(wrong), Err(CatalogueError::Toml(reason)) if reason.contains("unknown framework")));
    }

    #[test]
    fn an_image_not_pinned_by_digest_is_refused() {
        let text =
            "[[image]]\nframework = \"jax\"\nversion = \"0.4\"\nstack = \"cuda-12\"\nvendor = \"nvidia\"\nreference = \"jax:latest\"\n";
        assert!(matches!(Catalogue::parse(text), Err(CatalogueError::NotPinned { index: 0, .. })));
    }
}

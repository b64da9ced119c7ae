//! Synthetic traces: zipf-distributed 4 KiB block accesses with a given write fraction, in
//! libCacheSim's CSV form (`version,time,op,size,lbn`, ops `28`/`2a`), for benchmarks.

use std::io::Write;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

use crate::error::{Result, SimError};

/// What to generate.
#[derive(Debug, Clone)]
pub struct ZipfSpec {
    /// Requests (lines).
    pub requests: u64,
    /// Distinct blocks to draw from.
    pub blocks: u64,
    /// Zipf exponent (0 = uniform; 0.9 is typical of storage traces).
    pub alpha: f64,
    /// Share of writes, 0..=1.
    pub write_fraction: f64,
    /// Random seed.
    pub seed: u64,
}

/// Writes the trace to `out`.
pub fn write_zipf(spec: &ZipfSpec, out: &mut impl Write) -> Result<()> {
    if spec.blocks == 0 || spec.blocks > 1 << 40 {
        return Err(SimError::Invalid(format!(
            "--blocks {} must be between 1 and 2^40",
            spec.blocks
        )));
    }
    if !(0.0..=1.0).contains(&spec.write_fraction) {
        return Err(SimError::Invalid(format!(
            "--write-fraction {} must be between 0 and 1",
            spec.write_fraction
        )));
    }
    let zipf = Zipf::new(spec.blocks as f64, spec.alpha)
        .map_err(|e| SimError::Invalid(format!("--alpha {}: {e}", spec.alpha)))?;
    let mut rng = SmallRng::seed_from_u64(spec.seed);
    // Scatter ranks over the address space so hot blocks are not adjacent (an odd multiplier
    // is a bijection modulo a power of two; ranks beyond `blocks` never occur).
    let span = spec.blocks.next_power_of_two();
    let io = |source| SimError::Io {
        source_name: "output".into(),
        source,
    };
    writeln!(out, "version,time,op,size,lbn").map_err(io)?;
    for time in 0..spec.requests {
        let rank = zipf.sample(&mut rng) as u64 - 1;
        let block = rank.wrapping_mul(0x9e37_79b9_7f4a_7c15) & (span - 1);
        let op = if rng.random::<f64>() < spec.write_fraction {
            "2a"
        } else {
            "28"
        };
        writeln!(out, "1,{time},{op},4096,{}", block * 8).map_err(io)?;
    }
    out.flush().map_err(io)
}

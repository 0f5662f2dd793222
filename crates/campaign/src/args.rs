//! The command line.

use std::path::PathBuf;

use crate::Error;

/// `--cycles N --seed S --dir D --hosts 1|2 --hermes-python PATH --hermes-share F
/// --step-share F`.
pub(crate) struct Args {
    pub(crate) cycles: u64,
    pub(crate) seed: u64,
    pub(crate) dir: Option<PathBuf>,
    pub(crate) hosts: usize,
    /// The Python of a venv holding Hermes and the hermes-e2b wheel: some host processes are
    /// then Hermes hosts (`hermes_host.py`).
    pub(crate) hermes_python: Option<PathBuf>,
    /// The share of host processes that are Hermes hosts.
    pub(crate) hermes_share: f64,
    /// The share of one-process cycles (of a Rust host, one machine) given a checkpoint step.
    pub(crate) step_share: f64,
}

const USAGE: &str = "usage: campaign [--cycles N] [--seed S] [--dir D] [--hosts 1|2] \
                     [--hermes-python PATH [--hermes-share F]] [--step-share F]";

pub(crate) fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        cycles: 50,
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64,
        dir: None,
        hosts: 1,
        hermes_python: None,
        hermes_share: 1.0 / 3.0,
        step_share: 0.5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--cycles" => args.cycles = value()?.parse()?,
            "--seed" => args.seed = value()?.parse()?,
            "--dir" => args.dir = Some(PathBuf::from(value()?)),
            "--hosts" => {
                args.hosts = value()?.parse()?;
                if !(1..=2).contains(&args.hosts) {
                    return Err("--hosts takes 1 or 2".into());
                }
            }
            // Absolute, since the hosts run elsewhere; not canonical, since a venv's python
            // is a symlink whose target is not the venv.
            "--hermes-python" => args.hermes_python = Some(std::path::absolute(value()?)?),
            "--hermes-share" => {
                args.hermes_share = value()?.parse()?;
                if !(0.0..=1.0).contains(&args.hermes_share) {
                    return Err("--hermes-share takes a fraction from 0 to 1".into());
                }
            }
            "--step-share" => {
                args.step_share = value()?.parse()?;
                if !(0.0..=1.0).contains(&args.step_share) {
                    return Err("--step-share takes a fraction from 0 to 1".into());
                }
            }
            other => return Err(format!("unknown argument {other:?}; {USAGE}").into()),
        }
    }
    // The plugin has no setting for a coordination directory of its own, so a Hermes host
    // cannot stand in for a second machine; nor does it upload the writer marker.
    if args.hermes_python.is_some() && args.hosts == 2 {
        return Err("--hermes-python runs with --hosts 1 only".into());
    }
    Ok(args)
}

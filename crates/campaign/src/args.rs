//! The command line.

use std::path::PathBuf;

use crate::Error;

/// `--cycles N --seed S --dir D --hosts 1|2`.
pub(crate) struct Args {
    pub(crate) cycles: u64,
    pub(crate) seed: u64,
    pub(crate) dir: Option<PathBuf>,
    pub(crate) hosts: usize,
}

pub(crate) fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        cycles: 50,
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64,
        dir: None,
        hosts: 1,
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
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: campaign [--cycles N] [--seed S] [--dir D] \
                     [--hosts 1|2]"
                )
                .into());
            }
        }
    }
    Ok(args)
}

//! `vgpu-bundle STUB CORE OUT`: writes the deployable bundle (the stub
//! with the core and its trailer appended, preload/bundle.h) to OUT,
//! through a temporary file and a rename. deploy/build.sh runs it.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [stub, core, out] = args.as_slice() else {
        eprintln!("usage: vgpu-bundle STUB CORE OUT");
        return ExitCode::from(2);
    };
    let read = |p: &str| std::fs::read(p).map_err(|e| format!("cannot read {p}: {e}"));
    let result = read(stub).and_then(|s| {
        let c = read(core)?;
        if !c.starts_with(b"\x7fELF") {
            return Err(format!("{core} is not an ELF file"));
        }
        let tmp = format!("{out}.tmp");
        std::fs::write(&tmp, vgpu_preload::bundle(&s, &c))
            .and_then(|()| std::fs::rename(&tmp, out))
            .map_err(|e| format!("cannot write {out}: {e}"))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-bundle: {e}");
            ExitCode::FAILURE
        }
    }
}

//! The `colibri` binary: everything happens in [`colibri::cli::main`].

fn main() -> std::process::ExitCode {
    colibri::cli::main()
}

fn main() -> std::process::ExitCode {
    profiler_agent::cli::main()
}

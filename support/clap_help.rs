//! Shared by every binary's tests (included with `#[path]`, beside a
//! `CliRoot` type naming the binary's clap parser): the flags, arguments
//! and subcommands of a clap command tree that have no help text. A user
//! reads `--help` before the docs; nothing in it may be blank.

/// `"gpux buy --tif"`-style paths of every argument and subcommand without
/// help, and of every command without `--version`.
pub fn undocumented(command: &clap::Command) -> Vec<String> {
    let mut missing = Vec::new();
    let mut root = command.clone();
    root.build();
    if root.get_version().is_none() {
        missing.push(format!("{} (no --version)", root.get_name()));
    }
    walk(&root, root.get_name(), &mut missing);
    missing
}

fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if matches!(id, "help" | "version") {
            continue;
        }
        let blank = |text: Option<&clap::builder::StyledStr>| text.is_none_or(|t| t.to_string().trim().is_empty());
        if blank(arg.get_help()) && blank(arg.get_long_help()) {
            let name = arg.get_long().map(|l| format!("--{l}")).unwrap_or_else(|| id.to_uppercase());
            missing.push(format!("{path} {name}"));
        }
    }
    for sub in command.get_subcommands() {
        let sub_path = format!("{path} {}", sub.get_name());
        if sub.get_name() != "help" && sub.get_about().is_none() && sub.get_long_about().is_none() {
            missing.push(format!("{sub_path} (no about)"));
        }
        walk(sub, &sub_path, missing);
    }
}

/// Every flag, argument and subcommand says what it is in `--help`, and the
/// binary answers `--version`.
#[test]
fn every_flag_argument_and_subcommand_has_help() {
    use clap::CommandFactory;
    assert_eq!(undocumented(&super::CliRoot::command()), Vec::<String>::new());
}

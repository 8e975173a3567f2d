//! Tests of the `log:` section: the log file resolves against the config directory, rotation
//! defaults, and every problem with its path.

use super::*;

#[test]
fn log_file_resolves_against_the_config_directory_with_default_rotation() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("logs")).unwrap();
    let cfg = dir.path().join("c.yaml");
    let c = load_str("log: { format: json, file: logs/colibri.log }", &cfg, &env).unwrap();
    assert_eq!(
        c.log_file,
        Some(LogFile {
            path: dir.path().join("logs/colibri.log"),
            max_size: 50 << 20,
            max_files: 10,
        })
    );
    let c = load_str(
        "log: { file: logs/colibri.log, max_size: 64KiB, max_files: 3 }",
        &cfg,
        &env,
    )
    .unwrap();
    let f = c.log_file.unwrap();
    assert_eq!((f.max_size, f.max_files), (64 << 10, 3));
    assert_eq!(load("").unwrap().log_file, None);
}

#[test]
fn log_file_problems_are_all_reported_with_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    let problems = |text: &str| match load_str(text, &cfg, &env) {
        Err(ConfigError::Invalid { problems, .. }) => {
            problems.iter().map(|p| p.to_string()).collect::<Vec<_>>()
        }
        other => panic!("{other:?}"),
    };
    let missing = dir.path().join("nowhere");
    assert_eq!(
        problems("log: { file: nowhere/colibri.log, max_size: 1KiB, max_files: 0 }"),
        [
            "log.max_size: must be at least 64KiB".to_string(),
            "log.max_files: must be at least 1".to_string(),
            format!(
                "log.file: directory {}: no such file (colibri does not create it)",
                missing.display()
            ),
        ]
    );
    assert_eq!(
        problems("log: { max_size: 1MiB, max_files: 2 }"),
        [
            "log.max_size: only applies with log.file (without it events go to stderr)",
            "log.max_files: only applies with log.file (without it events go to stderr)",
        ]
    );
    std::fs::create_dir(dir.path().join("logs")).unwrap();
    assert_eq!(
        problems("log: { file: logs }"),
        [format!(
            "log.file: {} is a directory",
            dir.path().join("logs").display()
        )]
    );
    assert_eq!(
        problems(r#"log: { file: "" }"#),
        ["log.file: must name a file"]
    );
}

//! Tests of the `tasks:` section by type (file_move, to_stream, http_scrape) and of the rule that
//! a producer writes what its stream's sink sends.

use super::*;

#[test]
fn a_file_move_task_compiles() {
    let dir = tempfile::tempdir().unwrap();
    let (from, to) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::create_dir(&from).unwrap();
    std::fs::create_dir(&to).unwrap();
    let c = load(&format!(
        "tasks: [{{ name: mv, type: file_move, every: 10s, from: {:?}, to: {:?}, pattern: [\"*.csv\"], \
         exclude: [\"tmp-*\"], settle: 2m, on_conflict: skip, max_files: 50 }}]",
        from.display(),
        to.display()
    ))
    .unwrap();
    let Action::FileMove(m) = &c.tasks[0].action else {
        panic!("not file_move")
    };
    assert_eq!(c.tasks[0].action.kind(), "file_move");
    assert_eq!((&m.from, &m.to), (&from, &to));
    assert_eq!(m.pattern[0].as_str(), "*.csv");
    assert_eq!(m.exclude[0].as_str(), "tmp-*");
    assert_eq!(m.settle, Duration::from_secs(120));
    assert_eq!(m.on_conflict, crate::task::file_move::OnConflict::Skip);
    assert_eq!(m.max_files, 50);

    // Defaults.
    let c = load(&format!(
        "tasks: [{{ name: mv, type: file_move, every: 10s, from: {:?}, to: {:?}, pattern: [\"*\"] }}]",
        from.display(),
        to.display()
    ))
    .unwrap();
    let Action::FileMove(m) = &c.tasks[0].action else {
        panic!("not file_move")
    };
    assert_eq!(m.settle, Duration::from_secs(30));
    assert_eq!(m.on_conflict, crate::task::file_move::OnConflict::Rename);
    assert_eq!(m.max_files, 1000);
}

#[test]
fn file_move_problems_are_all_reported() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain");
    std::fs::write(&file, "").unwrap();
    let d = dir.path().display();
    let p = problems(&format!(
        "tasks:\n\
         - {{ name: a, type: file_move, every: 1s, from: /nonexistent/in, to: {:?}, pattern: [], settle: 0s, max_files: 0 }}\n\
         - {{ name: b, type: file_move, every: 1s, from: {d:?}, to: {d:?}, pattern: [\"[\", \"a/b\"] }}\n\
         - {{ name: c, type: file_move, every: 1s, from: {d:?}, to: /tmp, pattern: [\"*\"], on_conflict: merge }}\n\
         - {{ name: d, type: file_move, every: 1s, from: {d:?}, pattern: [\"*\"] }}",
        file.display()
    ));
    let expect = [
        "tasks[0] \"a\": from: /nonexistent/in: no such file",
        "tasks[0] \"a\": to: ",
        "tasks[0] \"a\": pattern: must list at least one glob",
        "tasks[0] \"a\": settle: must be positive",
        "tasks[0] \"a\": max_files: must be at least 1",
        "tasks[1] \"b\": to: ",
        "tasks[1] \"b\": pattern[0]: ",
        "tasks[1] \"b\": pattern[1]: ",
        "tasks[2] \"c\": on_conflict: unknown variant `merge`, expected one of `rename`, `overwrite`, `skip`",
        "tasks[3] \"d\"",
    ];
    assert_has(&p, &expect);
    assert!(
        p.iter()
            .any(|x| x.contains("is not a directory") && x.starts_with("tasks[0]")),
        "{p:#?}"
    );
    assert!(
        p.iter().any(|x| x.contains("same directory as from")),
        "{p:#?}"
    );
    assert!(
        p.iter()
            .any(|x| x.contains("needs to (a directory) or to_stream")),
        "{p:#?}"
    );
}

#[test]
fn to_stream_problems_are_all_reported() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let p = problems(&format!(
        "streams: {{ files: {{}} }}\n\
         tasks:\n\
         - {{ name: a, type: file_move, every: 1s, from: {d:?}, to_stream: nope, pattern: [\"*\"], on_conflict: skip, archive: /nonexistent/arch }}\n\
         - {{ name: b, type: file_move, every: 1s, from: {d:?}, to: /tmp, to_stream: files, pattern: [\"*\"] }}\n\
         - {{ name: c, type: file_move, every: 1s, from: {d:?}, to: /tmp, archive: /tmp, pattern: [\"*\"] }}"
    ));
    let expect = [
        "tasks[0] \"a\": on_conflict: only applies to to",
        "tasks[0] \"a\": to_stream: stream \"nope\" is not defined under streams: (defined: files)",
        "tasks[0] \"a\": archive: /nonexistent/arch: no such file",
        "tasks[1] \"b\": to_stream: is instead of to",
        "tasks[2] \"c\": archive: only applies to to_stream",
    ];
    assert_has(&p, &expect);
    assert_eq!(p.len(), expect.len(), "{p:#?}");
    // A valid one: the spool lives in the data directory, under the task's name.
    let c = crate::config::load_str(
        &format!(
            "data_dir: {d:?}\nstreams: {{ files: {{}} }}\ntasks:\n  - {{ name: ship-scans, type: file_move, every: 1s, from: {d:?}, to_stream: files, archive: {d:?}, pattern: [\"*.pdf\"] }}\n"
        ),
        &dir.path().join("c.yaml"),
        &|_| None,
    )
    .unwrap();
    let Action::FileMove(m) = &c.tasks[0].action else {
        panic!("not file_move")
    };
    let ship = m.ship.as_ref().expect("ships");
    assert_eq!(ship.stream, "files");
    assert_eq!(ship.spool_dir, dir.path().join("spool/ship-scans"));
    assert_eq!(m.to, ship.spool_dir);
    assert_eq!(ship.archive.as_deref(), Some(dir.path()));
}

#[test]
fn http_scrape_problems_are_all_reported() {
    let p = problems(
        r##"
sinks:
  v1: { type: http, url: "http://127.0.0.1:8428/write?precision=s", encoding: influx_line }
  nd: { type: http, url: "http://127.0.0.1:9/x", precision: ms }
streams: { m: { sink: v1 } }
tasks:
  - { name: a, type: http_scrape, every: 1s, url: "ftp://x/", format: prometheus, stream: nope }
  - { name: b, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: prometheus, stream: m, json: { records: /a } }
  - { name: c, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: json, stream: m, json: { records: "a", fields: { t: "x~2" }, time_unit: s } }
  - { name: d, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: raw, stream: m, tags: { a: b }, max_body: 0B }
  - { name: e, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: prometheus, stream: m, measurement: "#x", headers: { "bad header": v } }
  - { name: f, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: prometheus, stream: m, deadband: lots, heartbeat: 0s, fields: { t: { deadband: -1 } } }
  - { name: g, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: raw, stream: m, deadband: "2%" }
"##,
    );
    let expect = [
        "sinks.v1.url: names a precision",
        "sinks.nd.precision: only applies to encoding: influx_line",
        "tasks[0] \"a\": url: \"ftp://x/\": the scheme must be http or https",
        "tasks[0] \"a\": stream: stream \"nope\" is not defined",
        "tasks[1] \"b\": json: only applies to format: json",
        "tasks[2] \"c\": json.records: \"a\"",
        "tasks[2] \"c\": json.fields.t: \"x~2\"",
        "tasks[2] \"c\": json.time_unit: only applies with json.time",
        "tasks[3] \"d\": stream: \"m\": format: raw writes JSON records",
        "tasks[3] \"d\": tags: only apply to line protocol",
        "tasks[3] \"d\": max_body: must be positive",
        "tasks[4] \"e\": measurement: ",
        "tasks[4] \"e\": headers.bad header: is not a valid header name",
        "tasks[5] \"f\": deadband: \"lots\": a number (absolute, 0.5) or a percent of the value last sent (\"2%\")",
        "tasks[5] \"f\": heartbeat: must be positive",
        "tasks[5] \"f\": fields.t.deadband: -1: must be a finite number, 0 or more",
        "tasks[6] \"g\": stream: \"m\": format: raw writes JSON records",
        "tasks[6] \"g\": deadband: report by exception applies to values: format: prometheus or json, not raw",
    ];
    assert_has(&p, &expect);
    assert_eq!(p.len(), expect.len(), "{p:#?}");
}

/// A tail source writes JSON envelopes, a raw scrape JSON, a prometheus or json scrape line
/// protocol: each is refused where the stream's sink would send them unreadable, and the ingest API
/// learns what each stream carries.
#[test]
fn every_producer_must_write_what_its_stream_sink_sends() {
    let p = problems(
        r#"
sinks:
  tsdb: { type: http, url: "http://127.0.0.1:8428/write", encoding: influx_line, precision: ms }
  central: { type: http, url: "http://127.0.0.1:9/x" }
  arr: { type: http, url: "http://127.0.0.1:9/y", encoding: json_array }
streams: { metrics: { sink: tsdb }, logs: { sink: central }, arr: { sink: arr } }
sources:
  app: { type: tail, paths: [/var/log/app.log], stream: metrics }
tasks:
  - { name: raw, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: raw, stream: metrics }
  - { name: prom, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: prometheus, stream: logs }
  - { name: mills, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: json, stream: arr }
"#,
    );
    let expect = [
        "sources.app.stream: stream \"metrics\" is delivered as influx line protocol (its sink has encoding: influx_line), but a tail source's records are JSON objects",
        "tasks[0] \"raw\": stream: \"metrics\": format: raw writes JSON records, but the stream's sink sends influx line protocol",
        "tasks[1] \"prom\": stream: \"logs\": this format writes influx line protocol, but the stream's sink sends JSON",
        "tasks[2] \"mills\": stream: \"arr\": this format writes influx line protocol, but the stream's sink sends JSON",
    ];
    assert_has(&p, &expect);
    assert_eq!(p.len(), expect.len(), "{p:#?}");

    // Where the sink carries them, the same producers are fine; file, stdout and no sink take both.
    let c = load(
        r#"
ingest: { listen: "127.0.0.1:9465" }
sinks:
  tsdb: { type: http, url: "http://127.0.0.1:8428/write", encoding: influx_line, precision: ms }
  central: { type: http, url: "http://127.0.0.1:9/x" }
  out: { type: file, path: /tmp }
  console: { type: stdout }
streams: { metrics: { sink: tsdb }, logs: { sink: central }, files: { sink: out }, con: { sink: console }, q: {} }
sources:
  app: { type: tail, paths: [/var/log/app.log], stream: logs }
  app2: { type: tail, paths: [/var/log/app2.log], stream: files }
tasks:
  - { name: raw, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: raw, stream: logs }
  - { name: prom, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: prometheus, stream: metrics }
  - { name: p2, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: prometheus, stream: files }
  - { name: p3, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: prometheus, stream: q }
  - { name: r2, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: raw, stream: con }
"#,
    )
    .expect("a valid config");
    use crate::scrape::lineproto::Precision;
    assert_eq!(
        c.record_format("metrics"),
        RecordFormat::LineProtocol(Precision::Ms)
    );
    assert_eq!(c.record_format("logs"), RecordFormat::Json);
    for s in ["files", "con", "q"] {
        assert_eq!(c.record_format(s), RecordFormat::Lines, "{s}");
    }
    let ingest = c.ingest.expect("ingest on");
    assert_eq!(
        ingest.streams.get("metrics"),
        Some(&RecordFormat::LineProtocol(Precision::Ms))
    );
    assert_eq!(ingest.streams.get("logs"), Some(&RecordFormat::Json));
    assert_eq!(ingest.streams.len(), 5);
}

#[test]
fn a_scrape_takes_its_precision_from_the_sink_and_the_request_names_it() {
    let c = load(
        r#"
sinks:
  v1: { type: http, url: "http://127.0.0.1:8428/write?db=plant", encoding: influx_line, precision: us }
  v2: { type: http, url: "http://127.0.0.1:8086/api/v2/write?org=o&bucket=b", encoding: influx_line, precision: us }
  vm: { type: http, url: "http://127.0.0.1:8428/write", encoding: influx_line }
streams: { a: { sink: v1 }, b: { sink: v2 }, c: { sink: vm }, d: {} }
tasks:
  - { name: a, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: prometheus, stream: a }
  - { name: c, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: prometheus, stream: c, measurement: plc }
  - { name: d, type: http_scrape, every: 1s, url: "http://127.0.0.1:1/", format: json, stream: d }
"#,
    )
    .unwrap();
    use crate::scrape::lineproto::Precision;
    let url = |name: &str| match &c.sinks.iter().find(|s| s.name == name).unwrap().kind {
        SinkKind::Http(h) => h.url.to_string(),
        _ => unreachable!(),
    };
    // InfluxDB 1.x and VictoriaMetrics say `u`, 2.x says `us`; the default is explicit too.
    assert_eq!(
        url("v1"),
        "http://127.0.0.1:8428/write?db=plant&precision=u"
    );
    assert_eq!(
        url("v2"),
        "http://127.0.0.1:8086/api/v2/write?org=o&bucket=b&precision=us"
    );
    assert_eq!(url("vm"), "http://127.0.0.1:8428/write?precision=ns");
    let scrape = |i: usize| match &c.tasks[i].action {
        Action::HttpScrape(s) => s,
        _ => unreachable!(),
    };
    assert_eq!(scrape(0).precision, Precision::Us);
    assert_eq!(scrape(0).measurement, "a", "the task's name by default");
    assert_eq!(scrape(1).precision, Precision::Ns);
    assert_eq!(scrape(1).measurement, "plc");
    assert_eq!(
        scrape(2).precision,
        Precision::Ns,
        "a stream without a sink"
    );
}

/// An `exec` task's `stream:` settings: the records' format follows the stream's sink, a `format`
/// the sink cannot carry is refused naming the stream, and the settings that need a stream say so.
#[test]
fn exec_output_follows_its_stream_sink_and_every_mistake_is_named() {
    use crate::scrape::lineproto::Precision;
    use crate::task::exec::output::OutputFormat;
    let c = load(
        r#"
sinks:
  tsdb: { type: http, url: "http://127.0.0.1:8428/write", encoding: influx_line, precision: ms }
  central: { type: http, url: "http://127.0.0.1:9/x" }
streams: { metrics: { sink: tsdb }, logs: { sink: central }, q: {} }
tasks:
  - { name: a, type: exec, every: 1s, command: [/bin/true], stream: metrics }
  - { name: b, type: exec, every: 1s, command: [/bin/true], stream: logs, format: whole, append_failed: true }
  - { name: c, type: exec, every: 1s, command: [/bin/true], stream: q, format: line_protocol, max_output: 4KiB }
  - { name: d, type: exec, every: 1s, command: [/bin/true] }
"#,
    )
    .expect("a valid config");
    let outputs: Vec<_> = c
        .tasks
        .iter()
        .map(|t| match &t.action {
            Action::Exec(e) => e
                .output
                .as_ref()
                .map(|o| (o.stream.as_str(), o.format, o.max_output, o.append_failed)),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        outputs,
        [
            Some((
                "metrics",
                OutputFormat::Lines(RecordFormat::LineProtocol(Precision::Ms)),
                1 << 20,
                false
            )),
            Some(("logs", OutputFormat::Whole, 1 << 20, true)),
            Some((
                "q",
                OutputFormat::Lines(RecordFormat::LineProtocol(Precision::Ns)),
                4096,
                false
            )),
            None,
        ]
    );
    let p = problems(
        r#"
sinks:
  tsdb: { type: http, url: "http://127.0.0.1:8428/write", encoding: influx_line }
  central: { type: http, url: "http://127.0.0.1:9/x" }
streams: { metrics: { sink: tsdb }, logs: { sink: central } }
tasks:
  - { name: a, type: exec, every: 1s, command: [/bin/true], stream: metrics, format: json, append_failed: true }
  - { name: b, type: exec, every: 1s, command: [/bin/true], stream: logs, format: line_protocol, max_output: 0 }
  - { name: c, type: exec, every: 1s, command: [/bin/true], format: whole, max_output: 1KiB }
  - { name: d, type: exec, every: 1s, command: [/bin/true], stream: nowhere }
"#,
    );
    for want in [
        "tasks[0] \"a\": format: writes JSON records, but the stream's sink sends influx line protocol",
        "tasks[0] \"a\": append_failed: writes a JSON record, but stream \"metrics\"'s sink sends influx line protocol",
        "tasks[1] \"b\": format: writes influx line protocol, but the stream's sink sends JSON",
        "tasks[1] \"b\": max_output: must be between 1 byte and 64MiB",
        "tasks[2] \"c\": format: applies only with stream",
        "tasks[2] \"c\": max_output: applies only with stream",
        "tasks[3] \"d\": stream: ",
    ] {
        assert!(p.iter().any(|x| x.starts_with(want)), "{want} in {p:#?}");
    }
}

/// A `modbus` task compiles into the reads its points need (port 502 by default, line protocol in
/// the sink's precision), and each mistake names its field.
#[cfg(feature = "modbus")]
#[test]
fn a_modbus_task_compiles_and_every_mistake_is_named() {
    use crate::scrape::lineproto::Precision;
    use crate::task::modbus::Output;
    use crate::task::modbus::points::{Kind, Order, Table};
    let c = load(
        r#"
sinks:
  tsdb: { type: http, url: "http://127.0.0.1:8428/write", encoding: influx_line, precision: s }
streams: { metrics: { sink: tsdb } }
tasks:
  - name: drive
    type: modbus
    every: 5s
    address: plc.local
    unit: 3
    stream: metrics
    max_registers: 10
    points:
      - { name: speed, register: holding, address: 0 }
      - { name: temp, register: holding, address: 1, type: f32, word_order: little }
      - { name: far, register: holding, address: 9, type: u32 }
      - { name: run, register: coil, address: 7 }
"#,
    )
    .expect("a valid config");
    let Action::Modbus(m) = &c.tasks[0].action else {
        panic!("{:?}", c.tasks[0].action)
    };
    assert_eq!(
        (m.address.as_str(), m.unit, m.output, m.measurement.as_str()),
        (
            "plc.local:502",
            3,
            Output::LineProtocol(Precision::S),
            "drive"
        )
    );
    assert_eq!(
        (m.points[1].kind, m.points[1].word_order),
        (Kind::F32, Order::Little)
    );
    let reads: Vec<(Table, u16, u16)> = m
        .reads
        .iter()
        .map(|r| (r.table, r.start, r.count))
        .collect();
    // 0-2 in one read; 9-10 would make it 11 registers, over max_registers 10.
    assert_eq!(
        reads,
        [
            (Table::Coil, 7, 1),
            (Table::Holding, 0, 3),
            (Table::Holding, 9, 2)
        ]
    );
    let p = problems(
        r#"
streams: { q: {} }
tasks:
  - name: a
    type: modbus
    every: 5s
    address: "h:x"
    unit: 300
    stream: q
    max_registers: 200
    points:
      - { name: s, register: holding, address: 0, type: string }
      - { name: s, register: coil, address: 0, type: f32 }
      - { name: w, register: holding, address: 65535, type: u32, length: 2 }
      - { name: b, register: coil, address: 3, scale: 2, byte_order: little }
      - { name: n, register: holding, address: 5, word_order: little }
      - { name: f, register: holding, address: 6, type: f64, deadband: "x%", heartbeat: 0s }
  - { name: b, type: modbus, every: 5s, address: "[::1]:502", stream: nowhere, points: [] }
"#,
    );
    for want in [
        "tasks[0] \"a\": address: \"h:x\" is not host:port",
        "tasks[0] \"a\": unit: must be 0 to 255, not 300",
        "tasks[0] \"a\": max_registers: must be 1 to 125, not 200",
        "tasks[0] \"a\": points[0].length: a string needs its length in registers",
        "tasks[0] \"a\": points[1].name: \"s\" is named twice",
        "tasks[0] \"a\": points[1].type: coils and discrete inputs are bool",
        "tasks[0] \"a\": points[2].length: applies to type: string only",
        "tasks[0] \"a\": points[2].address: 65535 and the 1 after it pass 65535",
        "tasks[0] \"a\": points[3].scale: applies to numbers only",
        "tasks[0] \"a\": points[3].byte_order: applies to registers only",
        "tasks[0] \"a\": points[4].word_order: applies to values of two registers or more",
        "tasks[0] \"a\": points[5].deadband: \"x%\": a number (absolute, 0.5) or a percent",
        "tasks[0] \"a\": points[5].heartbeat: must be positive",
        "tasks[1] \"b\": stream: ",
        "tasks[1] \"b\": points: must name at least one point",
    ] {
        assert!(p.iter().any(|x| x.starts_with(want)), "{want} in {p:#?}");
    }
}

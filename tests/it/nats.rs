//! The `nats` sink end to end against Debian's `nats-server` with JetStream (installed by
//! `scripts/test.sh`): a three-node cluster on loopback (routes between 127.0.0.1 ports) and a
//! stream with three replicas, created and read back by the test through async-nats (the client
//! colibri's sink uses, talking to the real servers).
//!
//! Proven here: a backlog delivered while colibri is killed with kill -9 again and again and one
//! node of the cluster is killed and brought back ends in the stream with exactly the records
//! accepted, each once (counted by `Nats-Msg-Id` and by the records' own sequence numbers), in
//! order; a stream that does not take the subject turns the link down with a WARN naming the
//! subject, keeps the data and delivers it once the stream takes it; a wrong password is an
//! outage, not a dead letter; a refused connection is named so in the down reason.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use async_nats::jetstream;
use serde_json::Value;

use crate::remote_write::{dead_letters, queue};
use crate::tsdb::free_port;
use crate::util::client::Client;
use crate::util::{Proc, Sandbox, assert_code, field, poll, secs};

/// One nats-server with JetStream.
struct Node {
    child: Option<Child>,
    args: Vec<String>,
    port: u16,
    log: PathBuf,
}

impl Node {
    fn spawn(&mut self) {
        let log = std::fs::File::create(&self.log).unwrap();
        let bin = [
            "/usr/sbin/nats-server",
            "/usr/bin/nats-server",
            "nats-server",
        ]
        .into_iter()
        .find(|b| Path::new(b).exists())
        .unwrap_or("nats-server");
        self.child = Some(
            Command::new(bin)
                .args(&self.args)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start nats-server ({e}): install Debian's nats-server package (scripts/test.sh does)")
                }),
        );
        // A node brought back recovers its JetStream state before it listens: on a loaded
        // 2-core machine that can take more than 10 s.
        let port = self.port;
        poll(secs(45), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .unwrap_or_else(|| {
            panic!(
                "nats-server did not listen on {port}:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )
        });
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `n` nodes routed to each other (one node: no cluster), each with JetStream in its own
/// directory; `extra`: more arguments for every node.
fn cluster(dir: &Path, n: usize, extra: &[&str]) -> Vec<Node> {
    let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
    let routes = ports
        .iter()
        .map(|(_, c)| format!("nats://127.0.0.1:{c}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes: Vec<Node> = ports
        .iter()
        .enumerate()
        .map(|(i, (p, c))| {
            let mut args = vec![
                "-a".into(),
                "127.0.0.1".into(),
                "-p".into(),
                p.to_string(),
                "-n".into(),
                format!("n{i}"),
                "-js".into(),
                "-sd".into(),
                dir.join(format!("n{i}")).display().to_string(),
            ];
            if n > 1 {
                args.extend([
                    "--cluster_name".into(),
                    "c".into(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{c}"),
                    "--routes".into(),
                    routes.clone(),
                ]);
            }
            args.extend(extra.iter().map(|s| s.to_string()));
            Node {
                child: None,
                args,
                port: *p,
                log: dir.join(format!("n{i}.log")),
            }
        })
        .collect();
    for node in &mut nodes {
        node.spawn();
    }
    nodes
}

fn urls(nodes: &[Node]) -> String {
    let list: Vec<String> = nodes
        .iter()
        .map(|n| format!("\"nats://127.0.0.1:{}\"", n.port))
        .collect();
    format!("[{}]", list.join(", "))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Creates (or updates) the stream once the cluster has elected its JetStream leader.
fn ensure_stream(node: &Node, config: jetstream::stream::Config, opts: async_nats::ConnectOptions) {
    runtime().block_on(async {
        let client = opts
            .connect(format!("nats://127.0.0.1:{}", node.port))
            .await
            .unwrap();
        let js = jetstream::new(client);
        let deadline = tokio::time::Instant::now() + secs(30);
        loop {
            let done = match js.get_stream(&config.name).await {
                Ok(_) => js
                    .update_stream(config.clone())
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Err(_) => js
                    .create_stream(config.clone())
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
            };
            match done {
                Ok(()) => return,
                Err(e) if tokio::time::Instant::now() > deadline => panic!("stream: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    });
}

/// Every message of the stream: (sequence, Nats-Msg-Id, payload).
/// `op`, asked again while the cluster cannot answer (after a node is lost, JetStream answers
/// "temporarily unavailable" until its leaders are elected again), for at most 30 s.
async fn available<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    mut op: impl FnMut() -> F,
) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match op().await {
            Ok(t) => return t,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("reading {what}: {e}; asking again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("reading {what}: {e}"),
        }
    }
}

fn read_stream(
    node: &Node,
    name: &str,
    opts: async_nats::ConnectOptions,
) -> Vec<(u64, String, String)> {
    let header = |m: &jetstream::message::StreamMessage, name: &str| {
        m.headers
            .get(name)
            .map(|v| v.as_str().to_string())
            .unwrap_or_default()
    };
    read_raw(node, name, opts)
        .iter()
        .map(|m| {
            let id = header(m, "Nats-Msg-Id");
            (
                m.sequence,
                id,
                String::from_utf8_lossy(&m.payload).into_owned(),
            )
        })
        .collect()
}

/// Every message of the stream as JetStream keeps it, headers included.
fn read_raw(
    node: &Node,
    name: &str,
    opts: async_nats::ConnectOptions,
) -> Vec<jetstream::message::StreamMessage> {
    runtime().block_on(async {
        let client = opts
            .connect(format!("nats://127.0.0.1:{}", node.port))
            .await
            .unwrap();
        let js = jetstream::new(client);
        let stream = available("the stream", || js.get_stream(name)).await;
        let info = available("the stream's state", || stream.get_info()).await;
        let mut out = Vec::new();
        for seq in info.state.first_sequence..=info.state.last_sequence {
            if info.state.messages == 0 {
                break;
            }
            out.push(available("a message", || stream.get_raw_message(seq)).await);
        }
        out
    })
}

fn stream_messages(node: &Node, name: &str) -> u64 {
    stored(node.port, name)
}

/// How many messages the stream holds, as the server at `port` says (0 while it cannot).
fn stored(port: u16, name: &str) -> u64 {
    runtime().block_on(async {
        let Ok(client) = async_nats::connect(format!("nats://127.0.0.1:{port}")).await else {
            return 0;
        };
        let js = jetstream::new(client);
        match js.get_stream(name).await {
            Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
            Err(_) => 0,
        }
    })
}

/// Each record once, by message id and by its `seq`; jobs in order. A job's messages are published
/// together, so when some of them fail (a node lost, colibri killed) and the job is sent again,
/// those that had been stored keep their place and the others follow: a record can be stored
/// before others of its own job, never before an earlier job's. `job` is the records per job (the
/// push cuts jobs of exactly that many), 1 where every record must be in order.
#[track_caller]
fn check_exactly_once(messages: &[(u64, String, String)], n: u64, job: u64) {
    let mut by_id: BTreeMap<&str, u32> = BTreeMap::new();
    let mut seqs = Vec::new();
    for (_, id, payload) in messages {
        assert!(!id.is_empty(), "a message without Nats-Msg-Id: {payload}");
        *by_id.entry(id).or_default() += 1;
        let v: Value = serde_json::from_str(payload).expect("a JSON payload");
        seqs.push(v["seq"].as_u64().expect("a seq"));
    }
    let twice: Vec<_> = by_id.iter().filter(|(_, c)| **c > 1).collect();
    assert!(twice.is_empty(), "message ids stored twice: {twice:?}");
    let mut highest = 0;
    for (at, &seq) in seqs.iter().enumerate() {
        assert!(
            seq / job >= highest / job,
            "record {seq} stored at {at}, after record {highest} of a later job"
        );
        highest = highest.max(seq);
    }
    let mut sorted = seqs;
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "each record once");
}

fn config_for(sb: &Sandbox, urls: &str, extra: &str) -> PathBuf {
    sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
sinks:
  js:
    type: nats
    url: {urls}
    subject: "plant.{{stream}}"
    stream: PLANT
    timeout: 3s
    retry: {{ max_attempts: 1 }}
    link: {{ backoff_cap: 1s }}
{extra}
streams:
  temps: {{ sink: js, batch: {{ max_records: 100 }}, live_window: 1s }}
"#
    ))
}

#[test]
fn a_cluster_keeps_each_record_exactly_once_through_kill_9_and_a_lost_node() {
    let sb = Sandbox::new();
    let mut nodes = cluster(&sb.file(""), 3, &[]);
    ensure_stream(
        &nodes[0],
        jetstream::stream::Config {
            name: "PLANT".into(),
            subjects: vec!["plant.>".into()],
            num_replicas: 3,
            duplicate_window: Duration::from_secs(600),
            ..Default::default()
        },
        async_nats::ConnectOptions::new(),
    );
    let config = config_for(&sb, &urls(&nodes), "");
    let total = 60_000u64;
    let body: String = (0..total).map(|i| format!("{{\"seq\":{i}}}\n")).collect();
    let (code, _, err) = queue(&config, &["push", "temps"], &body);
    assert_eq!(code, 0, "{err}");
    // Each round kills colibri once some records more are in (or all are: the drain can be
    // quicker than the rounds); the third also loses a node while publishing.
    let mut last = 0;
    let mut kills = 0;
    for round in 0..6 {
        if last >= total {
            break;
        }
        let agent = Proc::run(&config);
        let port = nodes[0].port;
        let more = move |than: u64| {
            let n = stored(port, "PLANT");
            n > than + 200 || n >= total
        };
        agent.wait_until(secs(60), "deliveries under way", || more(last));
        if round == 2 {
            // One node gone while colibri publishes: the stream has a quorum without it.
            nodes[1].kill();
            let before = stream_messages(&nodes[0], "PLANT");
            agent.wait_until(secs(60), "deliveries without the node", || more(before));
            nodes[1].spawn();
        }
        agent.signal(libc::SIGKILL);
        drop(agent);
        kills += 1;
        last = stream_messages(&nodes[0], "PLANT");
    }
    assert!(
        kills >= 3,
        "the backlog drained before colibri was killed 3 times"
    );
    let mut agent = Proc::start(&config);
    agent.wait_until(secs(120), "every record in the stream", || {
        stream_messages(&nodes[0], "PLANT") >= total
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    let messages = read_stream(&nodes[0], "PLANT", async_nats::ConnectOptions::new());
    check_exactly_once(&messages, total, 100);
}

#[test]
fn a_stream_without_the_subject_is_an_outage_that_names_it_and_loses_nothing() {
    let sb = Sandbox::new();
    let nodes = cluster(&sb.file(""), 1, &["--user", "gw", "--pass", "right"]);
    let opts = || async_nats::ConnectOptions::new().user_and_password("gw".into(), "right".into());
    ensure_stream(
        &nodes[0],
        jetstream::stream::Config {
            name: "PLANT".into(),
            subjects: vec!["other.>".into()],
            ..Default::default()
        },
        opts(),
    );
    // A wrong password first: an outage, no attempt spent.
    let wrong = config_for(&sb, &urls(&nodes), "    username: gw\n    password: wrong");
    let body: String = (0..50).map(|i| format!("{{\"seq\":{i}}}\n")).collect();
    let (code, _, err) = queue(&wrong, &["push", "temps"], &body);
    assert_eq!(code, 0, "{err}");
    let mut agent = Proc::run(&wrong);
    let down = agent.wait_for_event(secs(20), "the link down", |e| {
        field(e, "message").starts_with("link down")
    });
    assert!(field(&down, "reason").contains("uthorization"), "{down}");
    // The client retries every few seconds; the log says it once.
    std::thread::sleep(secs(4));
    let loud = agent.events_where(|e| matches!(field(e, "level"), "WARN" | "ERROR"));
    assert_eq!(loud.len(), 1, "{loud:#?}");
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    // The right password, and a stream that does not take plant.temps.
    let config = config_for(&sb, &urls(&nodes), "    username: gw\n    password: right");
    let mut agent = Proc::run(&config);
    let down = agent.wait_for_event(secs(20), "the link down", |e| {
        field(e, "message").starts_with("link down")
    });
    let reason = field(&down, "reason");
    assert!(
        reason.contains("does not take subject plant.temps") && reason.contains("other.>"),
        "{reason}"
    );
    // The stream is fixed while colibri waits: everything arrives, once.
    ensure_stream(
        &nodes[0],
        jetstream::stream::Config {
            name: "PLANT".into(),
            subjects: vec!["other.>".into(), "plant.*".into()],
            ..Default::default()
        },
        opts(),
    );
    agent.wait_until(secs(30), "the records in the stream", || {
        read_stream(&nodes[0], "PLANT", opts()).len() == 50
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    check_exactly_once(&read_stream(&nodes[0], "PLANT", opts()), 50, 1);
    // Older than the stream's live window when sent: every message says it was replayed.
    for m in read_raw(&nodes[0], "PLANT", opts()) {
        let mark = m.headers.get("colibri-replayed").map(|v| v.as_str());
        assert_eq!(mark, Some("true"), "message {}", m.sequence);
    }
    let (code, out, err) = queue(&config, &["dead", "list", "temps", "--json"], "");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "", "no dead letters");
}

/// A record over the server's `max_payload` goes to the dead letters alone, with the reason; the
/// job's other records are delivered, each once, in order.
/// A subject naming `{field.line}`: the record of a job that lacks it is dead-lettered alone with
/// the reason, and the others are stored by JetStream, each once.
#[test]
fn a_record_the_subject_cannot_name_is_dead_lettered_alone_and_the_rest_of_its_job_delivered() {
    let sb = Sandbox::new();
    let nodes = cluster(&sb.file(""), 1, &[]);
    ensure_stream(
        &nodes[0],
        jetstream::stream::Config {
            name: "PLANT".into(),
            subjects: vec!["plant.>".into()],
            ..Default::default()
        },
        async_nats::ConnectOptions::new(),
    );
    let config = config_for(&sb, &urls(&nodes), "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace(
            "subject: \"plant.{stream}\"",
            "subject: \"plant.{field.line}\"",
        ),
    )
    .unwrap();
    let body =
        "{\"seq\":0,\"line\":1}\n{\"seq\":1,\"line\":1}\n{\"seq\":9}\n{\"seq\":2,\"line\":2}\n";
    let (code, _, err) = queue(&config, &["push", "temps"], body);
    assert_eq!(code, 0, "{err}");
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(30), "the three records that name a line", || {
        stream_messages(&nodes[0], "PLANT") == 3
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    check_exactly_once(
        &read_stream(&nodes[0], "PLANT", async_nats::ConnectOptions::new()),
        3,
        1,
    );
    let dead = dead_letters(&config, "temps");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["records"], serde_json::json!(["{\"seq\":9}"]));
    assert_eq!(
        dead[0]["last_error"],
        "record 2 of the job has no field line for the subject"
    );
}

#[test]
fn a_record_over_max_payload_is_dead_lettered_alone() {
    let sb = Sandbox::new();
    let conf = sb.file("limits.conf");
    std::fs::write(&conf, "max_payload: 512\n").unwrap();
    let nodes = cluster(&sb.file(""), 1, &["-c", &conf.display().to_string()]);
    ensure_stream(
        &nodes[0],
        jetstream::stream::Config {
            name: "PLANT".into(),
            subjects: vec!["plant.>".into()],
            ..Default::default()
        },
        async_nats::ConnectOptions::new(),
    );
    let config = config_for(&sb, &urls(&nodes), "");
    let big = "x".repeat(1000);
    let body =
        format!("{{\"seq\":0}}\n{{\"seq\":1}}\n{{\"seq\":9,\"pad\":\"{big}\"}}\n{{\"seq\":2}}\n");
    let (code, _, err) = queue(&config, &["push", "temps"], &body);
    assert_eq!(code, 0, "{err}");
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(30), "the three small records", || {
        stream_messages(&nodes[0], "PLANT") == 3
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    check_exactly_once(
        &read_stream(&nodes[0], "PLANT", async_nats::ConnectOptions::new()),
        3,
        1,
    );
    let (code, out, err) = queue(&config, &["dead", "list", "temps", "--json"], "");
    assert_eq!(code, 0, "{err}");
    let dead: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dead.len(), 1, "{out}");
    let reason = dead[0]["last_error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("record 2 of the job") && reason.contains("payload"),
        "{reason}"
    );
}

/// A server that refuses the connection is reported as such: the link's down reason (the WARN and
/// the admin API's `GET /-/sinks`) says "connection refused", not the client's "IO error".
#[test]
fn a_refused_connection_is_named_in_the_down_reason() {
    let sb = Sandbox::new();
    // Nothing listens there: a loopback connect is refused at once.
    let closed = free_port();
    let admin = free_port();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
admin: {{ listen: "127.0.0.1:{admin}" }}
sinks:
  js: {{ type: nats, url: "nats://127.0.0.1:{closed}", subject: "plant.{{stream}}", timeout: 3s, link: {{ backoff_cap: 1s }} }}
streams:
  temps: {{ sink: js }}
"#
    ));
    let (code, _, err) = queue(&config, &["push", "temps"], "{\"seq\":0}\n");
    assert_eq!(code, 0, "{err}");
    let mut agent = Proc::start(&config);
    let down = agent.wait_for_event(secs(30), "the link down", |e| {
        field(e, "message").starts_with("link down")
    });
    let logged = field(&down, "reason");
    let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], admin)));
    let sinks = c.request("GET", "/-/sinks", &[], None).unwrap().json();
    let js = sinks
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == "js"))
        .unwrap_or_else(|| panic!("js not in /-/sinks: {sinks}"));
    assert_eq!(js["link"], "down", "{sinks}");
    let reason = js["down_reason"].as_str().unwrap_or_default();
    for r in [reason, logged] {
        assert!(
            r.contains(&format!("127.0.0.1:{closed}")) && r.contains("connection refused"),
            "{r}"
        );
        assert!(!r.contains("IO error"), "{r}");
    }
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
}

//! `colibri opcua browse URL [NODE]`: the tree of an OPC UA server's nodes (from the Objects
//! folder unless NODE is given), one line each, indented by depth: browse name, id as the
//! source's `nodes:` take it (`nsu=<namespace URI>;...`), class, and for a variable its data
//! type and current value; so an operator can write the config without another tool. The
//! security options are the source's. Talks to the server, not to the agent. Built with the
//! `opcua` feature.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::setting::Secret;
use crate::source::opcua::node::NodeRef;
use crate::source::opcua::{Endpoint, browse, config::checked_security, connect};

#[derive(Debug, Subcommand)]
pub enum OpcuaCommand {
    /// Print the tree of a server's nodes with their ids, data types and current values
    Browse(BrowseArgs),
}

#[derive(Debug, Args)]
pub struct BrowseArgs {
    /// The server's endpoint, e.g. opc.tcp://plc1:4840
    url: String,
    /// Where to start (an id as in the source's nodes:); default the Objects folder (i=85)
    node: Option<String>,
    /// Levels below NODE to list
    #[arg(long, default_value_t = 4)]
    depth: usize,
    /// None, Basic256Sha256, Aes128_Sha256_RsaOaep or Aes256_Sha256_RsaPss
    #[arg(long)]
    security_policy: Option<String>,
    /// None, Sign or SignAndEncrypt
    #[arg(long)]
    security_mode: Option<String>,
    /// User name (anonymous without it)
    #[arg(long)]
    username: Option<String>,
    /// The user's password
    #[arg(long, env = "OPCUA_PASSWORD", hide_env_values = true)]
    password: Option<String>,
    /// A user certificate (DER or PEM) to log in with instead of a user name
    #[arg(long, requires = "user_private_key", conflicts_with = "username")]
    user_certificate: Option<PathBuf>,
    /// The private key of --user-certificate (PEM)
    #[arg(long, requires = "user_certificate")]
    user_private_key: Option<PathBuf>,
    /// colibri's certificate and the trusted servers' (a source's is <data_dir>/opcua-pki/<name>);
    /// default ./opcua-pki
    #[arg(long, default_value = "opcua-pki")]
    pki_dir: PathBuf,
    /// Trust the server's certificate if none is trusted yet (written to the pki directory)
    #[arg(long)]
    trust_on_first_use: bool,
}

pub fn main(cmd: OpcuaCommand) -> ExitCode {
    let OpcuaCommand::Browse(args) = cmd;
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &BrowseArgs) -> Result<(), String> {
    let security = checked_security(
        args.security_policy.as_deref(),
        args.security_mode.as_deref(),
    )
    .map_err(|(field, m)| format!("--{}: {m}", field.replace('_', "-")))?;
    let start = match &args.node {
        None => NodeRef::parse("i=85"),
        Some(n) => NodeRef::parse(n),
    }
    .map_err(|m| format!("NODE: {m}"))?;
    let ep = Endpoint {
        url: args.url.clone(),
        security,
        username: args.username.clone(),
        password: args.password.clone().map(Secret),
        user_certificate: args
            .user_certificate
            .clone()
            .zip(args.user_private_key.clone()),
        pki_dir: args.pki_dir.clone(),
        trust_on_first_use: args.trust_on_first_use,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let trusted_before = connect::trusted_certs(&ep.pki_dir);
    let rows = rt.block_on(async {
        let never = CancellationToken::new();
        let up = connect::open(&ep, ("browse", "colibri browse"), &never)
            .await
            .map_err(|e| format!("{}: {}", ep.url, e.unwrap_or_default()))?;
        let table = connect::namespace_table(&up.session).await?;
        let id = start.resolve(&table).ok_or_else(|| {
            format!(
                "NODE: the server has no namespace {:?}",
                start.uri.as_deref().unwrap_or_default()
            )
        })?;
        let rows = browse::tree(&up.session, &id, args.depth, true).await;
        let _ = up.session.disconnect().await;
        up.driver.abort();
        rows
    });
    for cert in connect::trusted_certs(&ep.pki_dir) {
        if !trusted_before.contains(&cert) {
            eprintln!(
                "trusted on first use: {} (in {})",
                cert,
                ep.pki_dir.join("trusted").display()
            );
        }
    }
    let rows = rows?;
    for r in &rows {
        let indent = "  ".repeat(r.depth - 1);
        match &r.variable {
            Some((data_type, value)) => println!(
                "{indent}{}  {}  {}  {data_type} = {value}",
                r.name, r.id, r.class
            ),
            None => println!("{indent}{}  {}  {}", r.name, r.id, r.class),
        }
    }
    if rows.len() >= browse::MOST_NODES {
        eprintln!(
            "(stopped at {} nodes: browse a node further down, or with a smaller --depth)",
            browse::MOST_NODES
        );
    }
    Ok(())
}

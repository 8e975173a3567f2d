//! The tree of an OPC UA server's nodes, for `colibri opcua browse` ([`tree`]): from a node
//! (the Objects folder unless told), its hierarchical references followed to a depth, each node
//! with its id written with its namespace URI (`nsu=`, what the source's `nodes:` take), its
//! browse name and class, and for a variable its data type and current value. Bounded in depth
//! and in nodes; a node reached twice is listed once. Does not print: the CLI does.

use opcua_client::Session;
use opcua_types::{
    AttributeId, BrowseDescription, BrowseDirection, BrowseResultMask, NodeClass, NodeId,
    ReadValueId, ReferenceTypeId, TimestampsToReturn, Variant,
};

use super::connect::{namespace_table, request};
use super::node::nsu_text;
use super::record;

/// Nodes listed at most (a server's whole address space can be millions).
pub const MOST_NODES: usize = 10_000;

/// One node of the tree.
#[derive(Debug)]
pub struct Row {
    pub depth: usize,
    pub name: String,
    /// `nsu=...;s=...` (or the plain id in namespace 0).
    pub id: String,
    pub class: String,
    /// A variable's data type and current value (JSON), when asked for.
    pub variable: Option<(String, String)>,
}

/// The nodes under `start` to `depth` levels, in tree order (a node's children after it); with
/// `values`, each variable's data type and current value read too.
pub async fn tree(
    session: &Session,
    start: &NodeId,
    depth: usize,
    values: bool,
) -> Result<Vec<Row>, String> {
    let table = namespace_table(session).await?;
    let mut rows = Vec::new();
    let mut seen = std::collections::HashSet::from([start.clone()]);
    // Depth first with an explicit stack, children pushed in reverse to keep the server's order.
    let mut stack = children(session, (start, 1, values), &table, &mut seen).await?;
    while let Some((row, id)) = stack.pop() {
        if rows.len() >= MOST_NODES {
            break;
        }
        let level = row.depth;
        rows.push(row);
        // The standard nodes (the Server object's diagnostics, types, ...) are listed, not
        // followed, unless browsed from: they are not data.
        if level < depth && (id.namespace != 0 || *start == id) {
            stack.extend(children(session, (&id, level + 1, values), &table, &mut seen).await?);
        }
    }
    Ok(rows)
}

/// The rows of `node`'s children not seen before, at `depth`, in reverse order.
async fn children(
    session: &Session,
    (node, depth, values): (&NodeId, usize, bool),
    table: &[String],
    seen: &mut std::collections::HashSet<NodeId>,
) -> Result<Vec<(Row, NodeId)>, String> {
    let mut out = Vec::new();
    for r in references(session, node).await? {
        let id = r.node_id.node_id.clone();
        // A node of another server (an expanded id with a URI of its own) is not followed.
        if !r.node_id.namespace_uri.is_empty() || !seen.insert(id.clone()) {
            continue;
        }
        let variable = if values && r.node_class == NodeClass::Variable {
            Some(variable(session, &id, table).await?)
        } else {
            None
        };
        let row = Row {
            depth,
            name: r.browse_name.name.as_ref().to_string(),
            id: nsu_text(&id, table),
            class: format!("{:?}", r.node_class),
            variable,
        };
        out.push((row, id));
    }
    out.reverse();
    Ok(out)
}

/// The hierarchical references of `node`, forward, every page of them.
async fn references(
    session: &Session,
    node: &NodeId,
) -> Result<Vec<opcua_types::ReferenceDescription>, String> {
    let desc = BrowseDescription {
        node_id: node.clone(),
        browse_direction: BrowseDirection::Forward,
        reference_type_id: ReferenceTypeId::HierarchicalReferences.into(),
        include_subtypes: true,
        node_class_mask: 0,
        result_mask: BrowseResultMask::All as u32,
    };
    let mut results = request(session.browse(&[desc], 1000, None)).await?;
    let mut out = Vec::new();
    // Bounded: a server that hands out continuation points forever stops at the node limit.
    for _ in 0..=MOST_NODES / 1000 {
        let Some(r) = results.pop() else { break };
        out.extend(r.references.unwrap_or_default());
        if r.continuation_point.is_null() {
            break;
        }
        results = request(session.browse_next(false, &[r.continuation_point])).await?;
    }
    Ok(out)
}

/// A variable's data type (its name for the standard ones) and current value.
async fn variable(
    session: &Session,
    id: &NodeId,
    table: &[String],
) -> Result<(String, String), String> {
    let read = |attribute: AttributeId| ReadValueId {
        node_id: id.clone(),
        attribute_id: attribute as u32,
        ..Default::default()
    };
    let values = request(session.read(
        &[read(AttributeId::DataType), read(AttributeId::Value)],
        TimestampsToReturn::Neither,
        0.0,
    ))
    .await?;
    let data_type = match values.first().and_then(|v| v.value.as_ref()) {
        Some(Variant::NodeId(t)) => type_name(t, table),
        _ => "?".into(),
    };
    let value = match values.get(1) {
        Some(v) if v.status.is_some_and(|s| !s.is_good()) => {
            format!("({})", v.status.map(|s| s.to_string()).unwrap_or_default())
        }
        Some(v) => v
            .value
            .as_ref()
            .map_or_else(|| "null".into(), |x| record::json(x).to_string()),
        None => "?".into(),
    };
    Ok((data_type, value))
}

/// The standard data types by name, others by id.
fn type_name(t: &NodeId, table: &[String]) -> String {
    const NAMES: [&str; 25] = [
        "Boolean",
        "SByte",
        "Byte",
        "Int16",
        "UInt16",
        "Int32",
        "UInt32",
        "Int64",
        "UInt64",
        "Float",
        "Double",
        "String",
        "DateTime",
        "Guid",
        "ByteString",
        "XmlElement",
        "NodeId",
        "ExpandedNodeId",
        "StatusCode",
        "QualifiedName",
        "LocalizedText",
        "Structure",
        "DataValue",
        "BaseDataType",
        "DiagnosticInfo",
    ];
    match (t.namespace, &t.identifier) {
        (0, opcua_types::Identifier::Numeric(n)) if (1..=25).contains(n) => {
            NAMES[*n as usize - 1].to_string()
        }
        _ => nsu_text(t, table),
    }
}

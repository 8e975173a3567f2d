//! A node as the config names it ([`NodeRef`]): `nsu=<namespace URI>;s=Name` or `ns=2;s=Name`
//! (or `i=`, `g=`, `b=`), and its resolution to the server's node id through the namespace table
//! the server has now, so a restart that renumbers namespaces changes nothing. Also the other
//! way ([`nsu_text`]): a node id written with its namespace URI, as `opcua browse` prints it.
//! Pure: the session reads the table, `config` parses.

use std::str::FromStr;

use opcua_types::NodeId;

/// A configured node id.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRef {
    /// As written in the file.
    pub text: String,
    /// The namespace URI, when written with `nsu=`: the index is looked up at each connection.
    pub uri: Option<String>,
    /// The id; its namespace index is the one written (0 while `uri` is set).
    pub id: NodeId,
}

impl NodeRef {
    /// Parses `nsu=URI;<id>` or an OPC UA node id string.
    pub fn parse(text: &str) -> Result<NodeRef, String> {
        let bad = || {
            format!(
                "{text:?} is not a node id (write nsu=<namespace URI>;s=Name, ns=2;s=Name or i=85)"
            )
        };
        let (uri, id) = match text.strip_prefix("nsu=") {
            Some(rest) => {
                let (uri, ident) = rest.split_once(';').ok_or_else(bad)?;
                if uri.is_empty() {
                    return Err(bad());
                }
                // OPC UA escapes ';' and '%' in a URI written in an id.
                let uri = uri
                    .replace("%3b", ";")
                    .replace("%3B", ";")
                    .replace("%25", "%");
                (Some(uri), NodeId::from_str(ident).map_err(|_| bad())?)
            }
            None => (None, NodeId::from_str(text).map_err(|_| bad())?),
        };
        if uri.is_some() && id.namespace != 0 {
            return Err(bad());
        }
        Ok(NodeRef {
            text: text.to_string(),
            uri,
            id,
        })
    }

    /// The identifier alone (`Temp` of `ns=2;s=Temp`, `85` of `i=85`): a node's default name.
    pub fn identifier(&self) -> String {
        let s = self.id.identifier.to_string();
        match s.split_once('=') {
            Some((_, v)) => v.to_string(),
            None => s,
        }
    }

    /// The node id on a server whose namespace table is `table`; `None` when its URI is not
    /// in the table.
    pub fn resolve(&self, table: &[String]) -> Option<NodeId> {
        match &self.uri {
            None => Some(self.id.clone()),
            Some(uri) => {
                let ns = table.iter().position(|u| u == uri)?;
                let mut id = self.id.clone();
                id.namespace = u16::try_from(ns).ok()?;
                Some(id)
            }
        }
    }
}

/// `id` written with its namespace URI (`nsu=URI;s=Name`), or as it is for namespace 0 or an
/// index the table does not have.
pub fn nsu_text(id: &NodeId, table: &[String]) -> String {
    match table.get(usize::from(id.namespace)) {
        Some(uri) if id.namespace != 0 => format!(
            "nsu={};{}",
            uri.replace('%', "%25").replace(';', "%3b"),
            id.identifier
        ),
        _ => id.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uri_is_resolved_against_the_table_of_the_day() {
        let n = NodeRef::parse("nsu=urn:plant;s=Line1.Temp").expect("parses");
        assert_eq!(n.identifier(), "Line1.Temp");
        let table = |uris: &[&str]| uris.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let before = n.resolve(&table(&["http://opcfoundation.org/UA/", "urn:plant"]));
        let after = n.resolve(&table(&[
            "http://opcfoundation.org/UA/",
            "urn:x",
            "urn:plant",
        ]));
        assert_eq!(before.expect("found").namespace, 1);
        assert_eq!(after.clone().expect("found").namespace, 2);
        assert_eq!(n.resolve(&table(&["http://opcfoundation.org/UA/"])), None);
        let all = table(&["http://opcfoundation.org/UA/", "urn:x", "urn:plant"]);
        assert_eq!(
            nsu_text(&after.expect("found"), &all),
            "nsu=urn:plant;s=Line1.Temp"
        );
    }

    #[test]
    fn plain_ids_and_bad_ones() {
        let n = NodeRef::parse("ns=2;i=17").expect("parses");
        assert_eq!(n.resolve(&[]).expect("kept").namespace, 2);
        assert_eq!(n.identifier(), "17");
        assert_eq!(
            NodeRef::parse("i=85").expect("parses").id,
            NodeId::new(0, 85u32)
        );
        for bad in [
            "",
            "Temp",
            "nsu=;s=x",
            "nsu=urn:x",
            "nsu=urn:x;ns=2;s=y",
            "ns=x;s=y",
        ] {
            let e = NodeRef::parse(bad).expect_err(bad);
            assert!(e.contains("is not a node id"), "{e}");
        }
    }
}

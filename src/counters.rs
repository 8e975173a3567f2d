//! [`counters!`]: a component's counters declared once, beside the code that counts. Each counter
//! is named once, with its documentation and, when the metrics page shows it, its family (name,
//! help, and the label value that tells it apart when several counters are one family's parts).
//! From that one declaration come the struct of `AtomicU64`s the component counts into, its
//! [`Family`] rows ([`Declared::FAMILIES`], written by [`write`] for `admin::render` and the
//! sources' list) and the summary the component logs at stop (`log_summary`, every counter a field
//! of its own). It knows no component: the sources and delivery declare their counters with it.

use crate::metrics::{Kind, Text};

/// Counters declared with [`counters!`], as code that holds them without knowing which asks.
pub trait Declared: Sized + 'static {
    const FAMILIES: &'static [Family<Self>];
}

/// Writes `families` with a sample per item (named by `label`), and per part where a family is
/// split by a second label; a family whose name does not end in `_total` is a gauge.
pub fn write<T>(t: &mut Text, label: &str, items: &[(&str, &T)], families: &[Family<T>]) {
    for parts in families.chunk_by(|a, b| a.name == b.name) {
        let Some(first) = parts.first() else { continue };
        // Prometheus' naming: a counter's name ends in `_total`; any other is a gauge (a state
        // such as "connected", or a time).
        let kind = if first.name.ends_with("_total") {
            Kind::Counter
        } else {
            Kind::Gauge
        };
        t.family(first.name, kind, first.help.unwrap_or_default());
        for (name, item) in items {
            for f in parts {
                let n = (f.read)(item) as f64;
                match f.part {
                    Some(part) => t.sample(f.name, &[(label, name), part], n),
                    None => t.sample(f.name, &[(label, name)], n),
                }
            }
        }
    }
}

/// A counter's metric family, as `FAMILIES` lists it.
pub struct Family<T> {
    pub name: &'static str,
    /// The family's help; on the first of a family's parts only.
    pub help: Option<&'static str>,
    /// The label and value that tell this part of the family apart from the others.
    pub part: Option<(&'static str, &'static str)>,
    pub read: fn(&T) -> u64,
}

/// Declares a struct of counters (`AtomicU64`, with `Default`), its metric families and its summary
/// log line:
///
/// ```text
/// counters! {
///     /// What a sink did.
///     pub struct SinkStats, logged as "delivery summary" by sink with { link_up: bool } {
///         /// Requests answered 2xx.
///         requests_ok => ("colibri_sink_requests_total" [result = "ok"], "Requests by result."),
///         /// Requests answered 4xx.
///         requests_rejected => ("colibri_sink_requests_total" [result = "rejected"]),
///         /// Counted and logged, not a metric.
///         appends,
///     }
///     // Fields that are not counters, each `Default` or given its initial value.
///     extra {
///         pub last: std::sync::Mutex<Option<u64>>,
///     }
/// }
/// ```
///
/// `FAMILIES` lists the counters that have a family, in declaration order (a family's parts next
/// to each other, the help on the first); `log_summary(key, with...)` logs at info the key (as
/// `%`), every counter and the `with` values.
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident, logged as $summary:literal by $key:ident
        $( with { $( $with:ident : $withty:ty ),* $(,)? } )?
        {
            $(
                $(#[$fmeta:meta])*
                $field:ident $( => (
                    $family:literal $([$label:ident = $value:literal])? $(, $help:literal)?
                ) )?
            ),* $(,)?
        }
        $(
            extra {
                $( $(#[$xmeta:meta])* $xvis:vis $xfield:ident : $xty:ty $(= $xinit:expr)? ),* $(,)?
            }
        )?
    ) => {
        $(#[$meta])*
        #[derive(Debug)]
        $vis struct $name {
            $( $(#[$fmeta])* pub $field: std::sync::atomic::AtomicU64, )*
            $($( $(#[$xmeta])* $xvis $xfield: $xty, )*)?
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $( $field: std::sync::atomic::AtomicU64::new(0), )*
                    $($( $xfield: $crate::counters::counters!(@init $($xinit)?), )*)?
                }
            }
        }

        impl $crate::counters::Declared for $name {
            const FAMILIES: &[$crate::counters::Family<Self>] = &[
                $($(
                    $crate::counters::Family {
                        name: $family,
                        help: $crate::counters::counters!(@opt $($help)?),
                        part: $crate::counters::counters!(@opt $((stringify!($label), $value))?),
                        read: |s: &Self| s.$field.load(std::sync::atomic::Ordering::Relaxed),
                    },
                )?)*
            ];
        }

        impl $name {
            /// Logs every counter at info, as one line with a field per counter.
            pub fn log_summary(&self, $key: &str $($(, $with: $withty)*)?) {
                use std::sync::atomic::Ordering::Relaxed;
                tracing::info!(
                    $key = %$key,
                    $( $field = self.$field.load(Relaxed), )*
                    $($( $with, )*)?
                    $summary
                );
            }
        }
    };
    (@init) => { Default::default() };
    (@init $e:expr) => { $e };
    (@opt) => { None };
    (@opt $e:expr) => { Some($e) };
}

pub(crate) use counters;

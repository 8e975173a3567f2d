//! [`counters!`]: a component's counters declared once, beside the code that counts. Each counter
//! is named once, with its documentation and, when the metrics page shows it, its family's name
//! and help; from that one declaration come the struct of `AtomicU64`s the component counts into,
//! the rows the metrics page writes (`FAMILIES`, read by `admin::render`) and the summary the
//! component logs at stop (`log_summary`, every counter as a field of its own). It knows no
//! component: the sources declare their stats with it.

/// Declares a struct of counters (`AtomicU64`, `Default`), its metric families and its summary
/// log line:
///
/// ```ignore
/// counters! {
///     /// What a source did.
///     pub struct SourceStats, logged as "source summary" {
///         /// Lines read.
///         lines_read => ("colibri_source_lines_total", "Lines a source read."),
///         /// Counted and logged, not a metric.
///         appends,
///     }
///     // Optional: fields that are not counters (must be `Default`).
///     extra {
///         pub read_to: std::sync::Mutex<Vec<u64>>,
///     }
/// }
/// ```
///
/// `FAMILIES` lists the counters that have a family, in declaration order, as
/// `(name, help, read)`; `log_summary(source, stream)` logs every counter at info.
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident, logged as $summary:literal {
            $(
                $(#[$fmeta:meta])*
                $field:ident $( => ($family:literal, $help:literal) )?
            ),* $(,)?
        }
        $(
            extra {
                $( $(#[$xmeta:meta])* $xvis:vis $xfield:ident : $xty:ty ),* $(,)?
            }
        )?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( $(#[$fmeta])* pub $field: std::sync::atomic::AtomicU64, )*
            $($( $(#[$xmeta])* $xvis $xfield: $xty, )*)?
        }

        impl $name {
            /// The metric families of these counters: (name, help, what each reads).
            pub const FAMILIES: &[(&'static str, &'static str, fn(&Self) -> u64)] = &[
                $($(
                    ($family, $help, |s: &Self| s.$field.load(std::sync::atomic::Ordering::Relaxed)),
                )?)*
            ];

            /// Logs every counter at info, as one line with a field per counter.
            pub fn log_summary(&self, source: &str, stream: Option<&str>) {
                use std::sync::atomic::Ordering::Relaxed;
                match stream {
                    Some(stream) => tracing::info!(
                        source = %source,
                        stream = %stream,
                        $( $field = self.$field.load(Relaxed), )*
                        $summary
                    ),
                    None => tracing::info!(
                        source = %source,
                        $( $field = self.$field.load(Relaxed), )*
                        $summary
                    ),
                }
            }
        }
    };
}

pub(crate) use counters;

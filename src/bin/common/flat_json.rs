//! JSON log records with every field at the top level: tracing-subscriber's `json` formatter
//! nests span fields under `spans`, where `run` and `node` of the agent's span would be hard to
//! filter on. This formatter reads the spans' fields as that formatter's [`JsonFields`] stored
//! them and merges them, outermost first, with the event's own fields (which win).

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// One JSON object per record: `timestamp`, `level`, `target`, then the spans' and the event's
/// fields (`message`, `run`, `gen`, `node`, `rank`, ...).
pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut obj = Map::new();
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        obj.insert("timestamp".into(), time.into());
        obj.insert("level".into(), event.metadata().level().as_str().into());
        obj.insert("target".into(), event.metadata().target().into());
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                let stored = ext.get::<FormattedFields<JsonFields>>();
                if let Some(Ok(Value::Object(fields))) =
                    stored.map(|f| serde_json::from_str::<Value>(f))
                {
                    obj.extend(fields);
                }
            }
        }
        event.record(&mut Fields(&mut obj));
        writeln!(writer, "{}", Value::Object(obj))
    }
}

/// Records an event's fields into a JSON object, numbers and booleans as such.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer lock").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn span_and_event_fields_are_top_level_and_the_event_wins() {
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span =
                tracing::info_span!("agent", run = "r", node = "n", gen = tracing::field::Empty);
            let _g = span.enter();
            tracing::info!("before");
            span.record("gen", 2u64);
            tracing::warn!(rank = 3, gen = 5u64, ok = true, "after {}", "x");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["run"], "r");
        assert_eq!(lines[0]["node"], "n");
        assert_eq!(lines[0]["message"], "before");
        assert_eq!(lines[0]["level"], "INFO");
        assert!(lines[0].get("gen").is_none(), "{text}");
        assert_eq!(lines[1]["gen"], 5, "the event's own field wins: {text}");
        assert_eq!(lines[1]["rank"], 3);
        assert_eq!(lines[1]["ok"], true);
        assert_eq!(lines[1]["message"], "after x");
        assert_eq!(lines[1]["node"], "n");
    }
}

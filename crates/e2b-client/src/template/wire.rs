//! The start-build body E2B takes (`TemplateBuildStartV2`), and the two renderings the SDK
//! makes of a template (`Template.to_json`, `Template.to_dockerfile`), made from that same
//! body so that what is rendered is what a build sends.

use std::io;

use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};

/// `fromImageRegistry`, as the SDK writes it.
#[derive(Serialize)]
#[serde(tag = "type")]
pub(super) enum RegistryWire<'a> {
    #[serde(rename = "registry")]
    Basic {
        username: &'a str,
        password: &'a str,
    },
    #[serde(rename = "aws")]
    Aws {
        #[serde(rename = "awsAccessKeyId")]
        access_key_id: &'a str,
        #[serde(rename = "awsSecretAccessKey")]
        secret_access_key: &'a str,
        #[serde(rename = "awsRegion")]
        region: &'a str,
    },
    #[serde(rename = "gcp")]
    Gcp {
        #[serde(rename = "serviceAccountJson")]
        service_account_json: &'a str,
    },
}

/// `TemplateBuildStartV2`, in the order the SDK writes it.
#[derive(Serialize)]
pub(crate) struct StartBody<'a> {
    #[serde(rename = "fromImage", skip_serializing_if = "Option::is_none")]
    pub(super) from_image: Option<&'a str>,
    #[serde(rename = "fromTemplate", skip_serializing_if = "Option::is_none")]
    pub(super) from_template: Option<&'a str>,
    #[serde(rename = "fromImageRegistry", skip_serializing_if = "Option::is_none")]
    pub(super) from_image_registry: Option<RegistryWire<'a>>,
    pub(super) force: bool,
    pub(super) steps: Vec<StepWire<'a>>,
    #[serde(rename = "startCmd", skip_serializing_if = "Option::is_none")]
    pub(super) start_cmd: Option<&'a str>,
    #[serde(rename = "readyCmd", skip_serializing_if = "Option::is_none")]
    pub(super) ready_cmd: Option<&'a str>,
}

/// One step of the body.
#[derive(Serialize)]
pub(super) struct StepWire<'a> {
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    pub(super) args: &'a [String],
    #[serde(rename = "filesHash", skip_serializing_if = "Option::is_none")]
    pub(super) files_hash: Option<&'a str>,
    pub(super) force: bool,
    #[serde(rename = "forceUpload", skip_serializing_if = "Option::is_none")]
    pub(super) force_upload: Option<bool>,
}

/// The body in the key order of the SDK's `Template.to_json` (which builds its dict in
/// another order than its HTTP client writes the request).
#[derive(Serialize)]
struct SdkJson<'b> {
    steps: Vec<SdkJsonStep<'b>>,
    force: bool,
    #[serde(rename = "fromImage", skip_serializing_if = "Option::is_none")]
    from_image: Option<&'b str>,
    #[serde(rename = "fromTemplate", skip_serializing_if = "Option::is_none")]
    from_template: Option<&'b str>,
    #[serde(rename = "fromImageRegistry", skip_serializing_if = "Option::is_none")]
    from_image_registry: Option<&'b RegistryWire<'b>>,
    #[serde(rename = "startCmd", skip_serializing_if = "Option::is_none")]
    start_cmd: Option<&'b str>,
    #[serde(rename = "readyCmd", skip_serializing_if = "Option::is_none")]
    ready_cmd: Option<&'b str>,
}

#[derive(Serialize)]
struct SdkJsonStep<'b> {
    #[serde(rename = "type")]
    kind: &'static str,
    args: &'b [String],
    force: bool,
    #[serde(rename = "filesHash", skip_serializing_if = "Option::is_none")]
    files_hash: Option<&'b str>,
    #[serde(rename = "forceUpload", skip_serializing_if = "Option::is_none")]
    force_upload: Option<bool>,
}

impl StartBody<'_> {
    /// The SDK's `Template.to_json` text: its key order, indented by two spaces, every
    /// character outside printable ASCII escaped (Python's `json.dumps(…, indent=2)`).
    pub(super) fn sdk_json(&self) -> String {
        let view = SdkJson {
            steps: self
                .steps
                .iter()
                .map(|step| SdkJsonStep {
                    kind: step.kind,
                    args: step.args,
                    force: step.force,
                    files_hash: step.files_hash,
                    force_upload: step.force_upload,
                })
                .collect(),
            force: self.force,
            from_image: self.from_image,
            from_template: self.from_template,
            from_image_registry: self.from_image_registry.as_ref(),
            start_cmd: self.start_cmd,
            ready_cmd: self.ready_cmd,
        };
        let mut out = Vec::new();
        let mut serializer = serde_json::Serializer::with_formatter(
            &mut out,
            PythonFormatter(PrettyFormatter::with_indent(b"  ")),
        );
        // Strings and booleans into memory: nothing can fail.
        view.serialize(&mut serializer)
            .expect("a template body serialises");
        String::from_utf8(out).expect("the JSON is ASCII")
    }

    /// The SDK's `Template.to_dockerfile` text: `FROM`, a line per step (RUN without its
    /// user, COPY without its owner and mode, `ENV k=v …` unquoted), `ENTRYPOINT` with the
    /// start command; no ready command and no registry login. A template built on another
    /// template has no Dockerfile (the reason is the error).
    pub(super) fn sdk_dockerfile(&self) -> Result<String, String> {
        if let Some(template) = self.from_template {
            return Err(format!(
                "the template is built on the template {template:?}, which no Dockerfile can \
                 name; only E2B can build it"
            ));
        }
        let Some(image) = self.from_image else {
            return Err("the template has no base image".to_owned());
        };
        let mut out = format!("FROM {image}\n");
        for step in &self.steps {
            let line = match (step.kind, step.args) {
                ("RUN", [command, ..]) => format!("RUN {command}"),
                ("COPY", [src, dest, ..]) => format!("COPY {src} {dest}"),
                ("ENV", pairs) => {
                    let pairs: Vec<String> = pairs
                        .chunks(2)
                        .map(|pair| format!("{}={}", pair[0], pair.get(1).map_or("", |v| v)))
                        .collect();
                    format!("ENV {}", pairs.join(" "))
                }
                (kind, args) => format!("{kind} {}", args.join(" ")),
            };
            out.push_str(&line);
            out.push('\n');
        }
        if let Some(start) = self.start_cmd.filter(|start| !start.is_empty()) {
            out.push_str(&format!("ENTRYPOINT {start}\n"));
        }
        Ok(out)
    }
}

/// serde_json's pretty printer, writing strings as Python's `json.dumps` does by default
/// (`ensure_ascii`): every character outside `' '..='~'` as `\uXXXX`, UTF-16 pairs above
/// U+FFFF. The escapes serde_json makes itself (`\"`, `\\`, `\n`, `\u001b`, …) are Python's.
struct PythonFormatter<'i>(PrettyFormatter<'i>);

impl Formatter for PythonFormatter<'_> {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut units = [0u16; 2];
        for c in fragment.chars() {
            if (' '..='~').contains(&c) {
                writer.write_all(&[c as u8])?;
            } else {
                for unit in c.encode_utf16(&mut units) {
                    write!(writer, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
    }

    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_array(writer)
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array(writer)
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(writer, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array_value(writer)
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object(writer)
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object(writer)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(writer, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object_value(writer)
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object_value(writer)
    }
}

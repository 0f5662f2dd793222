//! `to_json`, `to_dockerfile` and the helpers that build on E2B's own templates, against
//! what the official SDK (`e2b` 2.63) renders for the same builder calls on the same files
//! (`Template.to_json(t)` and `Template.to_dockerfile(t)`, pasted as they came out).

use super::fixture;
use crate::template::{
    CopyItem, CopyOptions, GitCloneOptions, ReadyCmd, RegistryCredentials, SymlinkMode,
    TemplateSpec, UploadMode,
};
use crate::{Operation, SecretValue};

// CHAIN
const CHAIN_JSON: &str = r#"{
  "steps": [
    {
      "type": "COPY",
      "args": [
        "folder",
        "/home/user/folder",
        "",
        ""
      ],
      "force": false,
      "filesHash": "d849adbff359d6e95c5a71ce2e121b7ad0d79347a34143c9f1c56b5d4d11b47b"
    },
    {
      "type": "COPY",
      "args": [
        "app.py",
        "/app/",
        "root",
        "0755"
      ],
      "force": false,
      "filesHash": "5116639053d9aca4a1bd44c4b15b3dac5fbecdcb1395dbf8c7d75d6cc1491d34"
    },
    {
      "type": "RUN",
      "args": [
        "whoami",
        "root"
      ],
      "force": false
    },
    {
      "type": "ENV",
      "args": [
        "A",
        "1",
        "B",
        "h\u00e9llo w\u00f6rld \u2603 \ud83d\ude00"
      ],
      "force": false
    },
    {
      "type": "WORKDIR",
      "args": [
        "/app"
      ],
      "force": false
    },
    {
      "type": "USER",
      "args": [
        "user"
      ],
      "force": false
    },
    {
      "type": "RUN",
      "args": [
        "printf 'a\\tb\\x1b[0m\u007f\u0001' \"q\" \\\\"
      ],
      "force": true
    }
  ],
  "force": false,
  "fromImage": "e2bdev/base",
  "startCmd": "python -m http.server 8000",
  "readyCmd": "[ -n \"$(ss -Htuln sport = :8000)\" ]"
}"#;
const CHAIN_DOCKERFILE: &str = "FROM e2bdev/base\nCOPY folder /home/user/folder\nCOPY app.py /app/\nRUN whoami\nENV A=1 B=héllo wörld ☃ 😀\nWORKDIR /app\nUSER user\nRUN printf 'a\\tb\\x1b[0m\u{7f}\u{1}' \"q\" \\\\\nENTRYPOINT python -m http.server 8000\n";
// MCP
const MCP_JSON: &str = r#"{
  "steps": [
    {
      "type": "RUN",
      "args": [
        "mcp-gateway pull brave exa",
        "root"
      ],
      "force": false
    },
    {
      "type": "RUN",
      "args": [
        "mcp-gateway pull duckduckgo",
        "root"
      ],
      "force": false
    }
  ],
  "force": false,
  "fromTemplate": "mcp-gateway"
}"#;
// DEVCONTAINER
const DEVCONTAINER_JSON: &str = r#"{
  "steps": [
    {
      "type": "RUN",
      "args": [
        "git clone https://example.com/p.git '/my project'"
      ],
      "force": false
    },
    {
      "type": "RUN",
      "args": [
        "devcontainer build --workspace-folder '/my project'",
        "root"
      ],
      "force": false
    }
  ],
  "force": false,
  "fromTemplate": "devcontainer",
  "startCmd": "sudo devcontainer up --workspace-folder '/my project' && sudo /prepare-exec.sh '/my project' | sudo tee /devcontainer.sh > /dev/null && sudo chmod +x /devcontainer.sh && sudo touch /devcontainer.up",
  "readyCmd": "[ -f /devcontainer.up ]"
}"#;
// ITEMS
const ITEMS_JSON: &str = r#"{
  "steps": [
    {
      "type": "COPY",
      "args": [
        "app.py",
        "/app/",
        "u:g",
        "0600"
      ],
      "force": true,
      "filesHash": "5116639053d9aca4a1bd44c4b15b3dac5fbecdcb1395dbf8c7d75d6cc1491d34",
      "forceUpload": true
    },
    {
      "type": "COPY",
      "args": [
        "folder/*",
        "/f/",
        "",
        ""
      ],
      "force": false,
      "filesHash": "e23addd8699435563515b5a1d50a812c701ec6437362069c5cb4f9bdf91e6034"
    },
    {
      "type": "COPY",
      "args": [
        "folder",
        "/g/",
        "",
        ""
      ],
      "force": false,
      "filesHash": "98d49f267730e3d5b0df21bf00ebc9b0692cae4eb17985a73e3463bacc40f670"
    }
  ],
  "force": false,
  "fromImage": "python:3",
  "readyCmd": "[ -f /tmp/ready ]"
}"#;
const ITEMS_DOCKERFILE: &str = r#"FROM python:3
COPY app.py /app/
COPY folder/* /f/
COPY folder /g/
"#;
// REGISTRY
const REGISTRY_JSON: &str = r#"{
  "steps": [
    {
      "type": "RUN",
      "args": [
        "true"
      ],
      "force": false
    }
  ],
  "force": false,
  "fromImage": "registry.example/app:1",
  "fromImageRegistry": {
    "type": "registry",
    "username": "me",
    "password": "pw-1"
  }
}"#;
const REGISTRY_DOCKERFILE: &str = r#"FROM registry.example/app:1
RUN true
"#;
// AWS
const AWS_JSON: &str = r#"{
  "steps": [],
  "force": false,
  "fromImage": "1.dkr.ecr.us-east-1.amazonaws.com/app:1",
  "fromImageRegistry": {
    "type": "aws",
    "awsAccessKeyId": "AKIA",
    "awsSecretAccessKey": "s3cr3t",
    "awsRegion": "us-east-1"
  }
}"#;
const AWS_DOCKERFILE: &str = r#"FROM 1.dkr.ecr.us-east-1.amazonaws.com/app:1
"#;
// FROM_DOCKERFILE
const FROM_DOCKERFILE_JSON: &str = r#"{
  "steps": [
    {
      "type": "USER",
      "args": [
        "root"
      ],
      "force": false
    },
    {
      "type": "WORKDIR",
      "args": [
        "/"
      ],
      "force": false
    },
    {
      "type": "COPY",
      "args": [
        "app.py",
        "/srv/",
        "node",
        ""
      ],
      "force": false,
      "filesHash": "d934c6bf25aa3e64fcd82dba13f0bfa42334176dc324b3ee3b38a5312619e083"
    },
    {
      "type": "ENV",
      "args": [
        "PORT",
        "3000",
        "NAME",
        "a b"
      ],
      "force": false
    },
    {
      "type": "USER",
      "args": [
        "node"
      ],
      "force": false
    },
    {
      "type": "WORKDIR",
      "args": [
        "/home/user"
      ],
      "force": false
    }
  ],
  "force": false,
  "fromImage": "node:20",
  "startCmd": "node app.py",
  "readyCmd": "sleep 20"
}"#;
const FROM_DOCKERFILE_DOCKERFILE: &str = r#"FROM node:20
USER root
WORKDIR /
COPY app.py /srv/
ENV PORT=3000 NAME=a b
USER node
WORKDIR /home/user
ENTRYPOINT node app.py
"#;
// EMPTY_START
const EMPTY_START_JSON: &str = r#"{
  "steps": [],
  "force": false,
  "fromImage": "ubuntu:24.04",
  "startCmd": "",
  "readyCmd": "true"
}"#;
const EMPTY_START_DOCKERFILE: &str = r#"FROM ubuntu:24.04
"#;

#[test]
fn a_chain_of_helpers_renders_as_the_sdk_renders_it() {
    let dir = fixture();
    let mut app = CopyOptions::new();
    app.mode = Some(0o755);
    app.user = Some("root".to_owned());
    let spec = TemplateSpec::from_base_image()
        .with_file_context(dir.path())
        .copy("folder", "/home/user/folder", &CopyOptions::new())
        .expect("valid")
        .copy("app.py", "/app/", &app)
        .expect("valid")
        .run_cmd_as("whoami", "root")
        .set_envs([("A", "1"), ("B", "héllo wörld ☃ 😀")])
        .set_workdir("/app")
        .set_user("user")
        .skip_cache()
        .run_cmd("printf 'a\\tb\\x1b[0m\u{7f}\u{1}' \"q\" \\\\")
        .set_start_cmd("python -m http.server 8000", ReadyCmd::wait_for_port(8000));
    assert_eq!(spec.to_json().expect("json"), CHAIN_JSON);
    assert_eq!(spec.to_dockerfile().expect("dockerfile"), CHAIN_DOCKERFILE);
}

#[test]
fn copy_items_are_copies_in_order() {
    let dir = fixture();
    let mut app = CopyItem::new("app.py", "/app/");
    app.options.upload = UploadMode::Always;
    app.options.user = Some("u:g".to_owned());
    app.options.mode = Some(0o600);
    let mut entries = CopyItem::new("folder/*", "/f/");
    entries.options.symlinks = SymlinkMode::Resolve;
    let spec = TemplateSpec::from_image("python:3")
        .with_file_context(dir.path())
        .copy_items([app, entries, CopyItem::new("folder", "/g/")])
        .expect("valid")
        .set_ready_cmd(ReadyCmd::wait_for_file("/tmp/ready"));
    assert_eq!(spec.to_json().expect("json"), ITEMS_JSON);
    assert_eq!(spec.to_dockerfile().expect("dockerfile"), ITEMS_DOCKERFILE);

    let error = TemplateSpec::from_base_image()
        .copy_items([CopyItem::new("ok", "/x"), CopyItem::new("/etc", "/y")])
        .expect_err("absolute");
    assert!(error.is_invalid_request(), "{error:?}");
    assert!(error.reason().contains("\"/etc\""), "{error}");
}

#[test]
fn mcp_servers_need_the_mcp_gateway_template() {
    let spec = TemplateSpec::from_template("mcp-gateway")
        .add_mcp_server(["brave", "exa"])
        .expect("gateway")
        .add_mcp_server(["duckduckgo"])
        .expect("gateway");
    assert_eq!(spec.to_json().expect("json"), MCP_JSON);
    // The SDK joins the names as they are, none included.
    let none = TemplateSpec::from_template("mcp-gateway")
        .add_mcp_server(Vec::<String>::new())
        .expect("gateway")
        .to_json()
        .expect("json");
    assert!(none.contains("\"mcp-gateway pull \""), "{none}");
    for base in [
        TemplateSpec::from_base_image(),
        TemplateSpec::from_template("mcp-gateway:v2"),
        TemplateSpec::from_image("mcp-gateway"),
    ] {
        let error = base.add_mcp_server(["exa"]).expect_err("not the gateway");
        assert!(error.is_invalid_request(), "{error:?}");
        assert!(error.reason().contains("mcp-gateway"), "{error}");
    }
}

#[test]
fn dev_container_steps_need_the_devcontainer_template() {
    let mut clone = GitCloneOptions::new();
    clone.path = Some("/my project".to_owned());
    let spec = TemplateSpec::from_template("devcontainer")
        .git_clone("https://example.com/p.git", clone)
        .beta_dev_container_prebuild("/my project")
        .expect("devcontainer")
        .beta_set_dev_container_start("/my project")
        .expect("devcontainer");
    assert_eq!(spec.to_json().expect("json"), DEVCONTAINER_JSON);
    let base = || TemplateSpec::from_base_image();
    for error in [
        base().beta_dev_container_prebuild("/p").expect_err("base"),
        base().beta_set_dev_container_start("/p").expect_err("base"),
    ] {
        assert!(error.is_invalid_request(), "{error:?}");
        assert!(error.reason().contains("devcontainer"), "{error}");
    }
}

#[test]
fn registry_logins_are_in_the_json_and_not_in_the_dockerfile() {
    let basic = TemplateSpec::from_private_image(
        "registry.example/app:1",
        RegistryCredentials::Basic {
            username: "me".to_owned(),
            password: SecretValue::new("pw-1".to_owned()),
        },
    )
    .run_cmd("true");
    assert_eq!(basic.to_json().expect("json"), REGISTRY_JSON);
    assert_eq!(
        basic.to_dockerfile().expect("dockerfile"),
        REGISTRY_DOCKERFILE
    );
    let aws = TemplateSpec::from_private_image(
        "1.dkr.ecr.us-east-1.amazonaws.com/app:1",
        RegistryCredentials::Aws {
            access_key_id: "AKIA".to_owned(),
            secret_access_key: SecretValue::new("s3cr3t".to_owned()),
            region: "us-east-1".to_owned(),
        },
    );
    assert_eq!(aws.to_json().expect("json"), AWS_JSON);
    assert_eq!(aws.to_dockerfile().expect("dockerfile"), AWS_DOCKERFILE);
}

#[test]
fn a_dockerfile_renders_back_as_the_sdk_renders_it() {
    let dir = fixture();
    let spec = TemplateSpec::from_dockerfile(
        "FROM node:20\nCOPY --chown=node app.py /srv/\nENV PORT=3000 NAME=\"a b\"\nUSER node\n\
         CMD [\"node\", \"app.py\"]\n",
    )
    .expect("parsed")
    .with_file_context(dir.path());
    assert_eq!(spec.to_json().expect("json"), FROM_DOCKERFILE_JSON);
    assert_eq!(
        spec.to_dockerfile().expect("dockerfile"),
        FROM_DOCKERFILE_DOCKERFILE
    );
}

#[test]
fn an_empty_start_command_has_no_entrypoint() {
    let spec = TemplateSpec::from_ubuntu_image("24.04").set_start_cmd("", "true");
    assert_eq!(spec.to_json().expect("json"), EMPTY_START_JSON);
    assert_eq!(
        spec.to_dockerfile().expect("dockerfile"),
        EMPTY_START_DOCKERFILE
    );
}

#[test]
fn what_cannot_be_rendered_is_refused() {
    let error = TemplateSpec::from_template("base")
        .run_cmd("true")
        .to_dockerfile()
        .expect_err("on a template");
    assert!(error.is_invalid_request(), "{error:?}");
    assert_eq!(error.operation(), Some(Operation::RenderTemplate));
    assert!(error.reason().contains("\"base\""), "{error}");

    let dir = fixture();
    let error = TemplateSpec::from_base_image()
        .with_file_context(dir.path())
        .copy("missing.txt", "/x", &CopyOptions::new())
        .expect("valid")
        .to_json()
        .expect_err("no such file");
    assert!(error.is_invalid_request(), "{error:?}");
    assert_eq!(error.operation(), Some(Operation::RenderTemplate));
    assert!(
        error
            .reason()
            .starts_with("COPY \"missing.txt\": No files found"),
        "{error}"
    );
}

/// The JSON is the start-build body: the same values, only in the SDK's `to_json` key order.
#[test]
fn the_json_is_the_body_a_build_sends() {
    let dir = fixture();
    let spec = TemplateSpec::from_base_image()
        .with_file_context(dir.path())
        .copy("app.py", "/app/", &CopyOptions::new())
        .expect("valid")
        .set_start_cmd("x", "true");
    let rendered: serde_json::Value =
        serde_json::from_str(&spec.to_json().expect("json")).expect("JSON");
    let hash = rendered["steps"][0]["filesHash"]
        .as_str()
        .expect("hash")
        .to_owned();
    let sent = serde_json::to_value(spec.start_body(&[Some(hash)], false)).expect("body");
    assert_eq!(rendered, sent);
}

//! Delegated children in forks of the parent's sandbox (contract R15): each child sees only
//! its own writes, and its work comes back to the parent: as a branch in a git work tree,
//! as files elsewhere, with a file both changed kept as the parent's and the child's beside.

use std::time::Duration;

use std::sync::Arc;

use agent_sandbox::{Backend, ChildId, ChildSandbox, NoStateHooks, SandboxMode};

use crate::support::{World, metadata_of, ok};

fn ids(names: &[&str]) -> Vec<ChildId> {
    names
        .iter()
        .map(|name| ChildId::new(name).expect("id"))
        .collect()
}

fn forks(parent: &Backend, names: &[&str], dir: &str) -> Vec<ChildSandbox> {
    parent
        .fork_children(&ids(names), dir, Duration::from_secs(10))
        .expect("fork")
        .into_iter()
        .map(|child| child.expect("child started"))
        .collect()
}

#[test]
fn two_children_in_a_git_work_tree_each_see_only_their_own_work_and_come_back_as_branches() {
    // contract: R15 — isolated forks (same paths, same port), one branch per child with its
    // commits and one more of its uncommitted work; the parent's checkout untouched.
    let world = World::new();
    let parent = world.persistent();
    let home = ok(&parent, "echo -n $HOME");
    let dir = format!("{home}/proj");
    ok(
        &parent,
        &format!(
            "mkdir -p {dir} && cd {dir} && git init -q -b main && git config user.email p@x && \
             git config user.name p && echo base > shared.txt && git add . && git commit -qm base && \
             echo parent-dirty > dirty.txt"
        ),
    );
    let children = forks(&parent, &["a", "b"], &dir);
    assert!(children.iter().all(ChildSandbox::is_git));
    let listed = world.list();
    for child in &children {
        let entry = listed
            .iter()
            .find(|s| s.sandbox_id == child.sandbox_id)
            .expect("the fork is listed");
        let metadata = metadata_of(entry);
        assert_eq!(metadata["hermes.subagent"], child.id.as_str());
        assert_eq!(metadata["hermes.branch"], parent.info().unwrap().sandbox_id);
    }
    // Both write the same paths; each reads its own.
    for child in &children {
        let name = child.id.as_str();
        ok(
            child.backend(),
            &format!(
                "cd {dir} && echo {name} > /tmp/who && echo {name} >> shared.txt && \
                 git -c user.email=c@x -c user.name=c commit -qam 'child {name} commit' && \
                 echo {name}-uncommitted > {name}.txt"
            ),
        );
    }
    for child in &children {
        let seen = ok(child.backend(), "cat /tmp/who");
        assert_eq!(
            seen.trim(),
            child.id.as_str(),
            "a child reads only its own write"
        );
    }
    let before = ok(
        &parent,
        &format!("cd {dir} && git status --porcelain && cat shared.txt"),
    );
    for child in &children {
        let back = parent.bring_back(child).expect("brought back");
        assert_eq!(back.branches.len(), 1, "{back:?}");
        assert_eq!(back.branches[0].branch, child.id.branch());
        assert_eq!(back.branches[0].repository, dir);
        assert_eq!(back.branches[0].commits, 2, "{back:?}");
        assert!(back.written.is_empty(), "{back:?}");
        assert!(
            back.summary().contains(&child.id.branch()),
            "{}",
            back.summary()
        );
    }
    // The parent's work tree is as it was; the branches hold each child's work.
    assert_eq!(
        ok(
            &parent,
            &format!("cd {dir} && git status --porcelain && cat shared.txt")
        ),
        before
    );
    for name in ["a", "b"] {
        let log = ok(
            &parent,
            &format!("cd {dir} && git log --format=%s main..hermes-subagent/{name}"),
        );
        assert_eq!(
            log.lines().collect::<Vec<_>>(),
            [
                format!("hermes-subagent {name}: work left uncommitted"),
                format!("child {name} commit"),
            ]
        );
        let shown = ok(
            &parent,
            &format!(
                "cd {dir} && git show hermes-subagent/{name}:{name}.txt && git show hermes-subagent/{name}:shared.txt"
            ),
        );
        assert_eq!(shown, format!("{name}-uncommitted\nbase\n{name}\n"));
    }
    for child in children {
        let id = child.sandbox_id.clone();
        parent.end_child(child).expect("killed");
        assert!(world.list().iter().all(|s| s.sandbox_id != id));
    }
    parent.cleanup();
}

#[test]
fn a_directory_one_side_cannot_enter_is_named_and_nothing_under_it_is_deleted() {
    // contract: R15
    let world = World::new();
    let parent = world.persistent();
    let home = ok(&parent, "echo -n $HOME");
    let dir = format!("{home}/work");
    ok(
        &parent,
        &format!(
            "mkdir -p {dir}/locked {dir}/theirs && echo mine > {dir}/locked/a.txt && \
             echo old > {dir}/theirs/b.txt"
        ),
    );
    let [child] = forks(&parent, &["c1"], &dir).try_into().expect("one child");
    // The child locks a directory (its files would read as deleted) and writes into one
    // the parent then locks; it also writes a plain file.
    ok(
        child.backend(),
        &format!("cd {dir} && chmod 000 locked && echo child > theirs/b.txt && echo new > new.txt"),
    );
    ok(&parent, &format!("chmod 000 {dir}/theirs"));
    let back = parent.bring_back(&child).expect("brought back");
    assert_eq!(back.written, [format!("{dir}/new.txt")]);
    assert!(back.deleted.is_empty(), "{:?}", back.deleted);
    assert!(back.conflicts.is_empty(), "{:?}", back.conflicts);
    assert_eq!(
        back.unread,
        [format!("{dir}/locked"), format!("{dir}/theirs")]
    );
    let summary = back.summary();
    assert!(summary.contains(&format!("{dir}/locked")), "{summary}");
    assert_eq!(
        ok(
            &parent,
            &format!(
                "chmod 755 {dir}/theirs && cat {dir}/locked/a.txt {dir}/theirs/b.txt {dir}/new.txt"
            )
        ),
        "mine\nold\nnew\n"
    );
    parent.end_child(child).expect("killed");
    parent.cleanup();
}

#[test]
fn outside_git_the_childs_files_are_applied_and_a_file_both_changed_keeps_both() {
    // contract: R15
    let world = World::new();
    let parent = world.persistent();
    let home = ok(&parent, "echo -n $HOME");
    let dir = format!("{home}/work");
    ok(
        &parent,
        &format!(
            "mkdir -p {dir}/sub && cd {dir} && echo base > shared.txt && echo old > old.txt && \
             echo keep > keep.txt && echo kept > sub/x.txt && echo base > both.txt"
        ),
    );
    let [child] = forks(&parent, &["c1"], &dir).try_into().expect("one child");
    assert!(!child.is_git());
    ok(
        child.backend(),
        &format!(
            "cd {dir} && echo child > shared.txt && echo same > both.txt && rm old.txt && echo new > sub/new.txt && \
             printf '#!/bin/sh\\necho run\\n' > tool.sh && chmod +x tool.sh && ln -s keep.txt link"
        ),
    );
    // Meanwhile the parent changes two of the same files, one to what the child wrote.
    ok(
        &parent,
        &format!("cd {dir} && echo parent > shared.txt && echo same > both.txt"),
    );
    let back = parent.bring_back(&child).expect("brought back");
    assert_eq!(
        back.written,
        [
            format!("{dir}/link"),
            format!("{dir}/sub/new.txt"),
            format!("{dir}/tool.sh")
        ]
    );
    assert_eq!(back.deleted, [format!("{dir}/old.txt")]);
    assert_eq!(
        back.conflicts,
        [(
            format!("{dir}/shared.txt"),
            Some(format!("{dir}/shared.txt.hermes-subagent-c1"))
        )]
    );
    let summary = back.summary();
    assert!(
        summary.contains("shared.txt.hermes-subagent-c1"),
        "{summary}"
    );
    let seen = ok(
        &parent,
        &format!(
            "cd {dir} && cat shared.txt shared.txt.hermes-subagent-c1 sub/new.txt keep.txt sub/x.txt && \
             ./tool.sh && readlink link && test ! -e old.txt && echo gone && \
             test ! -e .hermes-subagent-c1.beside && echo clean"
        ),
    );
    assert_eq!(
        seen,
        "parent\nchild\nnew\nkeep\nkept\nrun\nkeep.txt\ngone\nclean\n"
    );
    // Nothing staged is left behind in the parent's /tmp.
    assert_eq!(
        ok(&parent, "ls /tmp | grep -c hermes-subagent || true").trim(),
        "0"
    );
    parent.end_child(child).expect("killed");
    parent.cleanup();
}

#[test]
fn a_child_that_changed_nothing_brings_nothing_back() {
    // contract: R15
    let world = World::new();
    let parent = world.persistent();
    let home = ok(&parent, "echo -n $HOME");
    let dir = format!("{home}/quiet");
    ok(&parent, &format!("mkdir -p {dir} && echo a > {dir}/a"));
    let [child] = forks(&parent, &["q"], &dir).try_into().expect("one child");
    // The fork is attached as its create answered, with the parent's home: no connect, no
    // home probe before its base is read.
    let stats = child.backend().stats();
    assert_eq!((stats.connects, stats.home_probes), (0, 0), "{stats:?}");
    ok(child.backend(), "echo elsewhere > /tmp/scratch");
    let back = parent.bring_back(&child).expect("brought back");
    assert!(back.written.is_empty() && back.deleted.is_empty() && back.conflicts.is_empty());
    let summary = back.summary();
    assert!(summary.contains("changed no file"), "{summary}");
    // Its scratch file is named, not copied.
    assert_eq!(back.elsewhere.paths, ["/tmp/scratch"], "{summary}");
    assert!(summary.contains("/tmp/scratch"), "{summary}");
    assert_eq!(
        ok(&parent, "test -e /tmp/scratch || echo absent"),
        "absent\n"
    );
    parent.end_child(child).expect("killed");
    parent.cleanup();
}

#[test]
fn the_childs_skills_and_memories_come_back_and_one_the_parent_changed_too_lands_beside() {
    // contract: R15 — state roots only, a file both changed kept beside, no deletion back.
    let world = World::new();
    let parent = world.persistent();
    let home = ok(&parent, "echo -n $HOME");
    let hermes = parent.info().expect("attached").remote_hermes_home;
    let dir = format!("{home}/work");
    ok(
        &parent,
        &format!(
            "mkdir -p {dir} {hermes}/skills/both {hermes}/skills/gone {hermes}/memories && \
             echo base > {hermes}/skills/both/SKILL.md && echo keep > {hermes}/skills/gone/SKILL.md"
        ),
    );
    let [child] = forks(&parent, &["s"], &dir).try_into().expect("one child");
    ok(
        child.backend(),
        &format!(
            "mkdir -p {hermes}/skills/new && echo new > {hermes}/skills/new/SKILL.md && \
             echo child > {hermes}/skills/both/SKILL.md && echo note > {hermes}/memories/MEMORY.md && \
             rm -r {hermes}/skills/gone && echo cache > {hermes}/not-state.txt"
        ),
    );
    ok(
        &parent,
        &format!("echo parent > {hermes}/skills/both/SKILL.md"),
    );
    let back = parent.bring_back(&child).expect("brought back");
    assert_eq!(
        back.state.written,
        ["memories/MEMORY.md", "skills/new/SKILL.md"]
    );
    assert_eq!(
        back.state.beside,
        [(
            "skills/both/SKILL.md".to_owned(),
            "skills/both/SKILL.md.hermes-subagent-s".to_owned()
        )]
    );
    assert!(
        back.summary().contains("skills/new/SKILL.md"),
        "{}",
        back.summary()
    );
    let seen = ok(
        &parent,
        &format!(
            "cd {hermes} && cat skills/new/SKILL.md skills/both/SKILL.md \
             skills/both/SKILL.md.hermes-subagent-s memories/MEMORY.md skills/gone/SKILL.md; \
             ls not-state.txt 2>&1 | grep -c 'No such'"
        ),
    );
    assert_eq!(
        seen.split_whitespace().collect::<Vec<_>>(),
        ["new", "parent", "child", "note", "keep", "1"]
    );
    parent.end_child(child).expect("killed");
    parent.cleanup();
}

#[test]
fn at_the_accounts_limit_a_childs_fork_takes_the_slot_of_an_idle_sibling_and_all_work_comes_back() {
    // contract: R15, L14 — the account runs two sandboxes: the parent and one fork. The
    // second fork pauses the first child's (idle between its tool calls), whose next command
    // resumes it in turn; nothing waits forever and every child's work comes back.
    let world = World::new();
    let parent = world.persistent();
    let home = ok(&parent, "echo -n $HOME");
    let dir = format!("{home}/limited");
    ok(
        &parent,
        &format!("mkdir -p {dir} && echo base > {dir}/base.txt"),
    );
    world.server().set_max_running(Some(2));
    let children = forks(&parent, &["one", "two"], &dir);
    assert_eq!(
        world.server().running_limit().1,
        2,
        "never more than the limit"
    );
    for child in &children {
        ok(
            child.backend(),
            &format!("echo {} > {dir}/{}.txt", child.id, child.id),
        );
    }
    for child in &children {
        let back = parent.bring_back(child).expect("brought back");
        assert_eq!(back.written, [format!("{dir}/{}.txt", child.id)]);
    }
    assert_eq!(
        ok(&parent, &format!("cat {dir}/one.txt {dir}/two.txt")),
        "one\ntwo\n"
    );
    for child in children {
        parent.end_child(child).expect("killed");
    }
    parent.cleanup();
}

#[test]
fn everything_the_child_changed_under_the_roots_comes_back_and_the_rest_is_named() {
    // contract: R15 — not only the working directory: every git work tree the child changed
    // as its branch, the rest of the home (less its caches), a configured path and a
    // directory its commands ran in as files, a file both changed kept beside; what it
    // changed elsewhere named, not copied.
    let world = World::new();
    let mut config = world.config(SandboxMode::Persistent);
    config.subagent_paths = vec!["/tmp/extra".to_owned()];
    let parent = Backend::new(
        config,
        world.scope("default"),
        world.services(),
        Arc::new(NoStateHooks),
    )
    .expect("backend");
    let home = ok(&parent, "echo -n $HOME");
    let git = "git -c user.email=p@x -c user.name=p";
    ok(
        &parent,
        &format!(
            "set -e; for r in repo other; do mkdir -p {home}/$r && cd {home}/$r && git init -q -b main && \
             echo base > README && git add . && {git} commit -qm base; done; \
             mkdir -p {home}/proj && cd {home}/proj && echo base > shared.txt && echo bye > gone.txt && \
             mkdir -p /tmp/extra && echo old > /tmp/extra/conf.txt"
        ),
    );
    let repo = format!("{home}/repo");
    let [child] = forks(&parent, &["w"], &repo).try_into().expect("one child");
    assert!(child.is_git());
    assert_eq!(child.roots(), [home.clone(), "/tmp/extra".to_owned()]);
    ok(
        child.backend(),
        &format!(
            "set -e; cd {repo} && echo more >> README && {git} commit -qam 'in repo'; \
             cd {home}/other && echo new > new.txt; \
             cd {home}/proj && echo a > a.txt && echo child >> shared.txt && rm gone.txt; \
             echo note > {home}/notes.md; mkdir -p {home}/.cache/pip && echo cached > {home}/.cache/pip/x; \
             echo scratch > /tmp/scratch.txt; echo new > /tmp/extra/conf.txt"
        ),
    );
    // A directory the child's commands ran in (Hermes' environment says so for each command).
    child.backend().worked_in("/tmp/build");
    ok(
        child.backend(),
        "mkdir -p /tmp/build && cd /tmp/build && echo obj > out.o",
    );
    // Meanwhile the parent changes one of the same files.
    ok(&parent, &format!("echo parent > {home}/proj/shared.txt"));

    let back = parent.bring_back(&child).expect("brought back");
    let branches: Vec<(&str, u64)> = back
        .branches
        .iter()
        .map(|b| (b.repository.as_str(), b.commits))
        .collect();
    let other = format!("{home}/other");
    assert_eq!(
        branches,
        [(repo.as_str(), 1), (other.as_str(), 1)],
        "{back:?}"
    );
    assert_eq!(
        back.written,
        [
            format!("{home}/notes.md"),
            format!("{home}/proj/a.txt"),
            "/tmp/build/out.o".to_owned(),
            "/tmp/extra/conf.txt".to_owned(),
        ],
        "{back:?}"
    );
    assert_eq!(back.deleted, [format!("{home}/proj/gone.txt")]);
    assert_eq!(
        back.conflicts,
        [(
            format!("{home}/proj/shared.txt"),
            Some(format!("{home}/proj/shared.txt.hermes-subagent-w"))
        )]
    );
    assert_eq!(back.elsewhere.paths, ["/tmp/scratch.txt"], "{back:?}");
    assert!(back.elsewhere.directories.is_empty(), "{back:?}");
    let summary = back.summary();
    assert!(
        summary.contains("/tmp/scratch.txt") && summary.contains("hermes-subagent/w"),
        "{summary}"
    );

    let seen = ok(
        &parent,
        &format!(
            "cd {home} && cat notes.md proj/a.txt proj/shared.txt proj/shared.txt.hermes-subagent-w \
             /tmp/extra/conf.txt /tmp/build/out.o && test ! -e proj/gone.txt && test ! -e .cache/pip/x && \
             test ! -e /tmp/scratch.txt && git -C other show hermes-subagent/w:new.txt && \
             git -C repo log --format=%s -1 hermes-subagent/w && git -C repo status --porcelain"
        ),
    );
    assert_eq!(
        seen, "note\na\nparent\nbase\nchild\nnew\nobj\nnew\nin repo\n",
        "the parent's version of a file both changed stays; the child's is beside it"
    );
    parent.end_child(child).expect("killed");
    parent.cleanup();
}

#[test]
fn a_fork_held_for_a_handed_off_process_is_listed_as_such_until_it_ends() {
    // contract: R16 — a child's fork kept after its work came back (for a process it handed
    // off) says so in the inventory, and ending it removes it and the note.
    let world = World::new();
    let parent = world.persistent();
    let home = ok(&parent, "echo -n $HOME");
    let [child] = forks(&parent, &["h"], &home).try_into().expect("one child");
    let inventory = agent_sandbox::Inventory::new(
        world.config(SandboxMode::Persistent),
        world.home.path().to_path_buf(),
        world.services(),
    );
    let entry = |id: &str| {
        inventory
            .list(
                agent_sandbox::Listing::ThisProfile,
                std::time::SystemTime::now(),
            )
            .expect("listed")
            .into_iter()
            .find(|entry| entry.sandbox_id == id)
    };
    let fork = child.sandbox_id.as_str().to_owned();
    let listed = entry(&fork).expect("the fork is listed");
    assert!(listed.subagent_recoverable && listed.subagent_held.is_none());
    parent.bring_back(&child).expect("brought back");
    parent.hold_child(
        &child,
        "process p1 (python3 -m http.server) handed off to its parent",
    );
    let listed = entry(&fork).expect("still listed");
    assert!(!listed.subagent_recoverable, "its work is back");
    assert_eq!(
        listed.subagent_held.as_deref(),
        Some("process p1 (python3 -m http.server) handed off to its parent")
    );
    parent.end_child(child).expect("ended");
    assert!(entry(&fork).is_none(), "killed");
    let notes = world.home.path().join("cache/e2b/subagents");
    assert_eq!(
        std::fs::read_dir(&notes).map_or(0, |dir| dir.count()),
        0,
        "no record or note is left"
    );
    parent.cleanup();
}

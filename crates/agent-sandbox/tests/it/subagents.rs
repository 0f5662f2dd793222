//! Delegated children in forks of the parent's sandbox (contract R15): each child sees only
//! its own writes, and its work comes back to the parent: as a branch in a git work tree,
//! as files elsewhere, with a file both changed kept as the parent's and the child's beside.

use std::time::Duration;

use agent_sandbox::{Backend, ChildId, ChildSandbox};

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
        assert_eq!(back.branch.as_deref(), Some(child.id.branch().as_str()));
        assert_eq!(back.commits, 2, "{back:?}");
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
    assert_eq!(back.written, ["link", "sub/new.txt", "tool.sh"]);
    assert_eq!(back.deleted, ["old.txt"]);
    assert_eq!(
        back.conflicts,
        [(
            "shared.txt".to_owned(),
            Some("shared.txt.hermes-subagent-c1".to_owned())
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
    assert!(
        back.summary().contains("changed no file"),
        "{}",
        back.summary()
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
        assert_eq!(back.written, [format!("{}.txt", child.id)]);
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

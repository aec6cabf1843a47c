//! The command's process group, the I/O side of `station-lease hold`: the command is started
//! as the leader of a process group of its own, so that what it starts in the background is
//! signalled with it; `station-lease` reaps it (and, on Linux, as the children's subreaper,
//! whatever of it was orphaned), says when the group is empty, and passes the terminal to the
//! group and back the way a shell does with a job.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, killpg, pthread_sigmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, getpid, setpgid, tcgetpgrp, tcsetpgrp};

use crate::holding::ChildEnd;

/// What reaping found out about the command itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandEvent {
    /// It ended.
    Ended(ChildEnd),
    /// A signal stopped it (Ctrl-Z at the terminal, or reading it from the background).
    Stopped,
}

/// The running command, leader of its own process group.
pub struct Group {
    /// The command's pid, which is also the group's id.
    leader: Pid,
    /// Whether `station-lease` was the terminal's foreground job when it started the command,
    /// and so handed the terminal (stdin) to the command's group.
    interactive: bool,
}

/// Makes `station-lease` the subreaper of what its command starts (Linux): a background job
/// whose parent has ended becomes its child rather than init's, so that it is reaped here and
/// the group empties (init in a container may never reap it).
pub fn become_subreaper() {
    #[cfg(target_os = "linux")]
    if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        crate::say(&format!(
            "cannot become the subreaper of the command's processes ({error}); the end of its background jobs is then only as reliable as init's reaping"
        ));
    }
}

/// Whether `station-lease` is the foreground job of the terminal that is its stdin: then the
/// command, whose group is its own, must be given the terminal, or it could neither read it nor
/// get Ctrl-C.
fn in_the_foreground() -> bool {
    let stdin = std::io::stdin();
    tcgetpgrp(stdin.as_fd()).is_ok_and(|foreground| foreground == getpgrp())
}

/// Makes `group` the terminal's (stdin's) foreground process group, from whichever group this
/// process is in: SIGTTOU, which a background group's `tcsetpgrp` gets, is blocked meanwhile.
/// Async-signal-safe (it runs between fork and exec too).
fn give_terminal(group: Pid) -> nix::Result<()> {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut before = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut before))?;
    // SAFETY: fd 0 stays open for the call; a borrowed fd is all tcsetpgrp needs.
    let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    let given = tcsetpgrp(stdin, group);
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None)?;
    given
}

impl Group {
    /// Starts `command` as the leader of a new process group; when `station-lease` is the
    /// terminal's foreground job, the new group becomes it (before the command runs).
    pub fn spawn(mut command: Command) -> std::io::Result<Group> {
        let interactive = in_the_foreground();
        // SAFETY: between fork and exec only async-signal-safe calls: setpgid, getpid,
        // sigprocmask and tcsetpgrp.
        unsafe {
            command.pre_exec(move || {
                setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
                if interactive {
                    give_terminal(getpid())?;
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        let leader = Pid::from_raw(i32::try_from(child.id()).map_err(std::io::Error::other)?);
        // Reaped by `reap`, not by std: dropping a `std::process::Child` leaves it be.
        drop(child);
        Ok(Group {
            leader,
            interactive,
        })
    }

    /// Sends `signal` to every process of the group. False when the group is empty.
    pub fn signal(&self, signal: Signal) -> bool {
        match killpg(self.leader, signal) {
            Ok(()) => true,
            Err(Errno::ESRCH) => false,
            Err(error) => {
                crate::say(&format!(
                    "could not send the command's process group {signal}: {error}"
                ));
                true
            }
        }
    }

    /// Whether any process of the group is left (reap first: a zombie still counts).
    pub fn is_empty(&self) -> bool {
        matches!(killpg(self.leader, None), Err(Errno::ESRCH))
    }

    /// Reaps every child that has ended (the command, and what was orphaned to
    /// `station-lease`) and says what happened to the command itself.
    pub fn reap(&self) -> Vec<CommandEvent> {
        let mut events = Vec::new();
        loop {
            let status = match waitpid(
                Pid::from_raw(-1),
                Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED),
            ) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return events,
                Err(Errno::EINTR) => continue,
                Err(error) => {
                    crate::say(&format!("could not reap the command: {error}"));
                    return events;
                }
                Ok(status) => status,
            };
            if status.pid() != Some(self.leader) {
                continue;
            }
            match status {
                WaitStatus::Exited(_, code) => {
                    events.push(CommandEvent::Ended(ChildEnd::Exited(code)))
                }
                WaitStatus::Signaled(_, signal, _) => {
                    events.push(CommandEvent::Ended(ChildEnd::Signalled(signal as i32)))
                }
                WaitStatus::Stopped(..) => events.push(CommandEvent::Stopped),
                _ => {}
            }
        }
    }

    /// Takes the terminal back from the command's group, if it has it (when the command has
    /// ended, or stopped).
    pub fn take_terminal_back(&self) {
        if !self.interactive {
            return;
        }
        let stdin = std::io::stdin();
        if tcgetpgrp(stdin.as_fd()).is_ok_and(|foreground| foreground == self.leader)
            && let Err(error) = give_terminal(getpgrp())
        {
            crate::say(&format!(
                "could not take the terminal back from the command: {error}"
            ));
        }
    }

    /// Stops `station-lease` itself, as the job the shell knows, until it is continued (`fg`,
    /// `bg`); then continues the command's group, giving it the terminal again when
    /// `station-lease` is back in the foreground. `stop_the_group` sends the group SIGTSTP
    /// first (when it was `station-lease` that was told to stop).
    pub fn suspend(&self, stop_the_group: bool) {
        if stop_the_group {
            self.signal(Signal::SIGTSTP);
        }
        self.take_terminal_back();
        // SIGSTOP, not SIGTSTP: station-lease listens for SIGTSTP (to stop the group with it),
        // so one it sent itself would not stop it. Stopped before `kill` returns.
        if let Err(error) = kill(getpid(), Signal::SIGSTOP) {
            crate::say(&format!("could not stop: {error}"));
        }
        if self.interactive
            && in_the_foreground()
            && let Err(error) = give_terminal(self.leader)
        {
            crate::say(&format!(
                "could not give the terminal back to the command: {error}"
            ));
        }
        self.signal(Signal::SIGCONT);
    }
}

/// How the command is shown in messages.
pub fn shown(program: &OsString) -> String {
    format!("{:?}", program.to_string_lossy())
}

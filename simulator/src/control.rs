//! A tiny line-based control interface for demos: one command a line, one line of answer.
//!
//! Commands: `drop`, `stall on|off`, `corrupt`, `delay MS`, `processing MS`, `remove CHANNEL`,
//! `restart`, `refuse on|off`, `shortread N|off`, `door open|closed`, `writes`, `reads CHANNEL`,
//! `status`, `help`.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::server::SimulatorHandle;

const HELP: &str = "commands: drop | stall on|off | corrupt | delay MS | processing MS | \
                    slowwrite CHANNEL MS | ignoreclose on|off | \
                    remove CHANNEL | restart | refuse on|off | shortread N|off | door open|closed | writes | \
                    history N | reads CHANNEL | status | help";

/// Serves control connections on `listener` until the simulator's task is dropped.
pub async fn run_control(listener: TcpListener, simulator: SimulatorHandle) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let simulator = simulator.clone();
        tokio::spawn(async move {
            let (read_half, mut write_half) = stream.into_split();
            let mut lines = BufReader::new(read_half).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.trim().is_empty() {
                    continue;
                }
                let mut answer = execute(&simulator, &line).await;
                answer.push('\n');
                if write_half.write_all(answer.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
    }
}

fn on_off(word: Option<&str>) -> Option<bool> {
    match word? {
        "on" | "true" | "1" => Some(true),
        "off" | "false" | "0" => Some(false),
        _ => None,
    }
}

fn millis(word: Option<&str>) -> Option<Duration> {
    word?.parse().ok().map(Duration::from_millis)
}

/// Carries out one command line; the answer is one line without its newline.
pub async fn execute(simulator: &SimulatorHandle, line: &str) -> String {
    let mut words = line.split_whitespace();
    let command = words.next().unwrap_or("");
    let argument = words.next();
    match command {
        "drop" => {
            let count = simulator.connection_count();
            simulator.drop_connections();
            format!("ok: dropped {count} connections")
        }
        "stall" => match on_off(argument) {
            Some(stalled) => {
                simulator.set_stall(stalled);
                format!("ok: stall {}", if stalled { "on" } else { "off" })
            }
            None => "error: stall on|off".to_owned(),
        },
        "corrupt" => {
            simulator.corrupt_next_reply();
            "ok: the next reply will be corrupt".to_owned()
        }
        "delay" => match millis(argument) {
            Some(delay) => {
                simulator.set_reply_delay(delay);
                format!("ok: replies delayed {} ms", delay.as_millis())
            }
            None => "error: delay MS".to_owned(),
        },
        "processing" => match millis(argument) {
            Some(time) => {
                simulator.set_processing_time(time);
                format!("ok: processing takes {} ms", time.as_millis())
            }
            None => "error: processing MS".to_owned(),
        },
        "slowwrite" => match (argument, millis(words.next())) {
            (Some(channel), Some(extra)) => {
                simulator.delay_next_write_to(channel, extra);
                format!(
                    "ok: the next write to {channel} takes {} ms more",
                    extra.as_millis()
                )
            }
            _ => "error: slowwrite CHANNEL MS".to_owned(),
        },
        "ignoreclose" => match on_off(argument) {
            Some(ignores) => {
                simulator.set_ignores_close(ignores);
                match ignores {
                    true => "ok: a closed connection's requests are carried out anyway (SPEC.md §4 broken)".to_owned(),
                    false => "ok: a closed connection's requests are abandoned (SPEC.md §4)".to_owned(),
                }
            }
            None => "error: ignoreclose on|off".to_owned(),
        },
        "remove" => match argument {
            Some(name) if simulator.remove_channel(name) => format!("ok: removed {name}"),
            Some(name) => format!("error: no such channel: {name}"),
            None => "error: remove CHANNEL".to_owned(),
        },
        "shortread" => match argument {
            Some("off") => {
                simulator.set_bus_read_limit(None);
                "ok: bus replies carry what the bus received".to_owned()
            }
            Some(n) => match n.parse::<usize>() {
                Ok(limit) => {
                    simulator.set_bus_read_limit(Some(limit));
                    format!("ok: bus replies carry at most {limit} bytes")
                }
                Err(_) => "error: shortread N|off".to_owned(),
            },
            None => "error: shortread N|off".to_owned(),
        },
        "door" => {
            let closed = match argument {
                Some("open") => false,
                Some("closed" | "close") => true,
                _ => return "error: door open|closed".to_owned(),
            };
            let name = SimulatorHandle::DOOR_CLOSED;
            if simulator.set_input(name, station_protocol::Value::Bool(closed)) {
                format!(
                    "ok: door {} ({name} = {})",
                    if closed { "closed" } else { "open" },
                    if closed { "True" } else { "False" }
                )
            } else {
                format!("error: this station has no {name}")
            }
        }
        "restart" => {
            simulator.restart();
            "ok: restarted".to_owned()
        }
        "refuse" => match on_off(argument) {
            Some(refuse) => match simulator.set_refuse_connections(refuse).await {
                Ok(()) => format!(
                    "ok: {}",
                    if refuse {
                        "refusing connections"
                    } else {
                        "accepting connections"
                    }
                ),
                Err(error) => format!("error: {error}"),
            },
            None => "error: refuse on|off".to_owned(),
        },
        "writes" => {
            let log = simulator.write_log();
            let items: Vec<String> = log
                .iter()
                .map(|w| {
                    format!(
                        "{:.3}s conn {} ({}) {}={}",
                        w.since_start.as_secs_f64(),
                        w.connection.0,
                        w.peer,
                        w.channel,
                        w.value.render().escape_debug()
                    )
                })
                .collect();
            format!(
                "ok: {} writes ({} older dropped): {}",
                log.len(),
                simulator.writes_dropped(),
                items.join("; ")
            )
        }
        "history" => match argument.and_then(|n| n.parse::<usize>().ok()) {
            Some(limit) => {
                simulator.set_history_limit(limit);
                format!("ok: keeping the newest {limit} writes and read batches")
            }
            None => "error: history N (the writes and read batches kept)".to_owned(),
        },
        "reads" => match argument {
            Some(name) => format!("ok: reads {}", simulator.reads_of(name)),
            None => "error: reads CHANNEL".to_owned(),
        },
        "status" => format!(
            "ok: connections {} accepted {} read frames {} applied writes {} writes dropped {} read batches dropped {}",
            simulator.connection_count(),
            simulator.connections_accepted(),
            simulator.read_frames(),
            simulator.write_log().len(),
            simulator.writes_dropped(),
            simulator.read_batches_dropped()
        ),
        "help" => HELP.to_owned(),
        other => format!("error: unknown command {other:?}; {HELP}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Profile, Simulator, StationClient};

    #[tokio::test]
    async fn reads_and_status_count_what_the_station_was_asked() {
        let simulator =
            Simulator::start(Profile::default_station(), "127.0.0.1:0".parse().unwrap())
                .await
                .unwrap();
        let mut client = StationClient::connect(simulator.local_addr())
            .await
            .unwrap();
        client.hello("control test").await.unwrap();
        let name = "0.1.ESH10000158.MON_3V3";
        client
            .read(&[name, "0.1.ESH10000158.MON_1V8"])
            .await
            .unwrap();
        client.read_one(name).await.unwrap();
        assert_eq!(
            execute(&simulator, &format!("reads {name}")).await,
            "ok: reads 2"
        );
        assert_eq!(
            execute(&simulator, "reads 0.1.ESH10000158.MON_1V8").await,
            "ok: reads 1"
        );
        assert_eq!(execute(&simulator, "reads").await, "error: reads CHANNEL");
        assert_eq!(
            execute(&simulator, &format!("slowwrite {name} 250")).await,
            format!("ok: the next write to {name} takes 250 ms more")
        );
        assert_eq!(
            execute(&simulator, "slowwrite ON1").await,
            "error: slowwrite CHANNEL MS"
        );
        assert!(
            execute(&simulator, "ignoreclose on")
                .await
                .starts_with("ok: a closed connection's requests are carried out anyway")
        );
        assert_eq!(
            execute(&simulator, "ignoreclose").await,
            "error: ignoreclose on|off"
        );
        assert!(
            execute(&simulator, "status")
                .await
                .contains("read frames 2"),
            "{}",
            execute(&simulator, "status").await
        );
    }
}

//! The one place process signals are handled.

/// Completes on the first SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown() {
    let interrupt = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(cause = %err, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(err) => {
                tracing::error!(cause = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => tracing::info!(signal = "SIGINT", "shutting down"),
        () = terminate => tracing::info!(signal = "SIGTERM", "shutting down"),
    }
}

/// Completes on each SIGHUP (the conventional "reload your configuration");
/// never, where there are no such signals or they cannot be listened for.
pub struct Hangups {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    /// Starts listening for SIGHUP.
    pub fn listen() -> Hangups {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let signal = signal(SignalKind::hangup())
                .map_err(|err| tracing::error!(cause = %err, "cannot listen for SIGHUP"))
                .ok();
            Hangups { signal }
        }
        #[cfg(not(unix))]
        Hangups {}
    }

    /// Waits for the next SIGHUP.
    pub async fn next(&mut self) {
        #[cfg(unix)]
        if let Some(signal) = &mut self.signal {
            // Several followers listen (policy file, token files, TLS
            // certificate); each says what it reloaded, so nothing is
            // logged here.
            signal.recv().await;
            return;
        }
        std::future::pending::<()>().await;
    }
}

impl std::fmt::Debug for Hangups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hangups").finish_non_exhaustive()
    }
}

/// Calls `reload` every `every` and on each SIGHUP; runs as long as it is
/// polled. How every file a process follows (a certificate, token files,
/// the proxy's coordinator token) is followed: a mounted Secret changes
/// under the process, and an operator can ask for the change at once.
pub async fn follow_files(every: std::time::Duration, reload: impl Fn()) {
    let mut poll = tokio::time::interval(every);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut hangups = Hangups::listen();
    loop {
        tokio::select! {
            _ = poll.tick() => {}
            () = hangups.next() => {}
        }
        reload();
    }
}

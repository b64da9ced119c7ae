//! One module per subcommand.

pub mod topology;

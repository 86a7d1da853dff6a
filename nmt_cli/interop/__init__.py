"""Reading models and data of other toolkits."""

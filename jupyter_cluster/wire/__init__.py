"""What crosses a process boundary as JSON: the models the sidebar and widgets read, a widget output's static part."""
